"""Counter keys (DESIGN §6): injective, at most 250 bytes whatever the values, no user hash tag.

The limit ident is not user text: it is built by `Limit` from the algorithm, window, calendar
zone and index, so the ident strategy below builds real `Limit` objects rather than inventing
strings the service can never produce.
"""

from __future__ import annotations

import zoneinfo

from hypothesis import given, settings
from hypothesis import strategies as st

from rls.config.model import ALGORITHMS, UNIT_SECONDS, Limit, Unit
from rls.core.keys import counter_key

MAX_KEY_BYTES = 250
MAX_PREFIX_BYTES = 32

# Characters that a careless encoding would confuse with structure, plus multi-byte unicode.
TRICKY = ["a", "b", "c", "_", "|", "%", "#", "{", "}", "7", "C", "2", "5", "B", "D", ":", "=",
          ".", "/", "*", " ", "é", "中", "😀", "\x00"]

tricky_text = st.text(alphabet=st.sampled_from(TRICKY), max_size=6)
any_text = st.one_of(
    tricky_text,
    st.text(max_size=20),
    st.text(alphabet=st.sampled_from(TRICKY), min_size=150, max_size=400),
)
parts_st = st.lists(st.tuples(any_text, any_text), max_size=4)

TIMEZONES = sorted(zoneinfo.available_timezones())


@st.composite
def idents(draw: st.DrawFn) -> str:
    """Idents as the service builds them: configured limits and request overrides."""
    unit = draw(st.sampled_from(sorted(UNIT_SECONDS)))
    multiplier = draw(st.one_of(st.just(1), st.integers(1, 4294967295)))
    if draw(st.booleans()):  # a RateLimitOverride from the request (outcomes.OverrideLimits)
        return f"o{UNIT_SECONDS[unit] * multiplier}"
    calendar = draw(st.booleans())
    return Limit(
        requests_per_unit=1,
        unit=unit,
        algorithm=draw(st.sampled_from(ALGORITHMS)),
        unit_multiplier=multiplier,
        calendar=calendar,
        timezone=draw(st.sampled_from(TIMEZONES)) if calendar else "UTC",
        index=draw(st.integers(0, 3)),
    ).ident


prefixes = st.one_of(
    st.sampled_from(["", "rl:", "p" * MAX_PREFIX_BYTES]),
    st.text(max_size=MAX_PREFIX_BYTES).filter(lambda p: len(p.encode()) <= MAX_PREFIX_BYTES),
)


def hash_tag(key: str) -> str | None:
    """The Redis Cluster hash tag of a key: text between the first `{` and the next `}`."""
    start = key.find("{")
    if start < 0:
        return None
    end = key.find("}", start + 1)
    if end <= start + 1:
        return None
    return key[start + 1 : end]


# -- injectivity ----------------------------------------------------------------------------


@settings(max_examples=100)
@given(
    prefix=st.sampled_from(["", "rl:"]),
    tuples=st.lists(
        st.tuples(tricky_text, st.lists(st.tuples(tricky_text, tricky_text), max_size=3),
                  st.sampled_from(["f1", "f60", "o60", "f60i1", "s3600cAsia/Shanghai"])),
        min_size=2,
        max_size=12,
    ),
)
def test_distinct_inputs_give_distinct_keys(prefix, tuples):
    keys = {}
    for domain, parts, ident in tuples:
        key = counter_key(prefix, domain, parts, ident)
        identity = (domain, tuple(parts), ident)
        other = keys.setdefault(key, identity)
        assert other == identity, f"{other!r} and {identity!r} share the key {key!r}"


@settings(max_examples=100)
@given(prefix=prefixes, a=st.tuples(any_text, parts_st, idents()),
       b=st.tuples(any_text, parts_st, idents()))
def test_distinct_pairs_including_long_values(prefix, a, b):
    if (a[0], tuple(a[1]), a[2]) == (b[0], tuple(b[1]), b[2]):
        return
    assert counter_key(prefix, *a) != counter_key(prefix, *b)


def test_reference_colliding_pair_is_distinct():
    # envoyproxy/ratelimit builds `domain_a_b_c_<window>` for both of these.
    k1 = counter_key("rl:", "domain", [("a_b", "c")], "f60")
    k2 = counter_key("rl:", "domain", [("a", "b_c")], "f60")
    assert k1 != k2


def test_separator_and_escape_lookalikes_are_distinct():
    cases = [
        ("d", [("a|b", "c")]),
        ("d", [("a", "b|c")]),
        ("d|a", [("b", "c")]),
        ("d", [("a%7Cb", "c")]),
        ("d", [("a", "b"), ("", "c")]),
        ("d", [("a", "b|"), ("c", "")]),
        ("d", [("a#", "b")]),
        ("d", [("a%23", "b")]),
        ("d", []),
        ("d", [("", "")]),
    ]
    keys = [counter_key("rl:", dom, parts, "f60") for dom, parts in cases]
    assert len(set(keys)) == len(keys), keys


def test_same_values_different_limit_ident_are_distinct():
    assert counter_key("rl:", "d", [("k", "v")], "f60") != counter_key(
        "rl:", "d", [("k", "v")], "f3600"
    )


def test_long_keys_stay_distinct():
    base = "x" * 300
    k1 = counter_key("rl:", "d", [("k", base + "1")], "f60")
    k2 = counter_key("rl:", "d", [("k", base + "2")], "f60")
    assert k1 != k2
    # A long key must never equal a short key either.
    assert k1 != counter_key("rl:", "d", [("k", "short")], "f60")


# -- bounded length -------------------------------------------------------------------------


@settings(max_examples=100)
@given(
    prefix=prefixes,
    domain=st.one_of(any_text, st.text(alphabet=st.sampled_from(["😀", "中", "é", "{"]),
                                       min_size=30, max_size=1100)),
    parts=st.lists(st.tuples(any_text, any_text), max_size=32),
    ident=idents(),
)
def test_key_is_at_most_250_bytes(prefix, domain, parts, ident):
    key = counter_key(prefix, domain, parts, ident)
    assert len(key.encode()) <= MAX_KEY_BYTES, (len(key.encode()), key)


def test_worst_case_key_length_unicode_domain_long_zone():
    """32-byte prefix, a domain of 4-byte characters, a calendar limit in a long zone name."""
    ident = Limit(
        requests_per_unit=1,
        unit=Unit.DAY,
        calendar=True,
        timezone="America/Argentina/Buenos_Aires",
    ).ident
    key = counter_key("p" * MAX_PREFIX_BYTES, "😀" * 100, [("user", "u" * 500)], ident)
    assert len(key.encode()) <= MAX_KEY_BYTES, (len(key.encode()), key)


def test_short_key_of_multibyte_characters_is_bounded_in_bytes():
    """Fewer than 200 characters can still be far more than 250 bytes."""
    key = counter_key("rl:", "d", [("user", "😀" * 150)], "f60")
    assert len(key.encode()) <= MAX_KEY_BYTES, (len(key), len(key.encode()))


def test_huge_values_bounded():
    parts = [(f"k{i}", "v" * 1024) for i in range(32)]
    key = counter_key("rl:", "domain", parts, "f60")
    assert len(key.encode()) <= MAX_KEY_BYTES


# -- hash tags ------------------------------------------------------------------------------


@settings(max_examples=100)
@given(
    prefix=st.sampled_from(["", "rl:", "app:"]),
    domain=any_text,
    parts=parts_st,
    ident=idents(),
)
def test_user_text_never_forms_a_hash_tag(prefix, domain, parts, ident):
    key = counter_key(prefix, domain, parts, ident)
    assert hash_tag(key) is None, key
    assert "{" not in key and "}" not in key, key


def test_explicit_hash_tag_attempt():
    key = counter_key("rl:", "{d}", [("{user}", "{42}"), ("a", "}{x}")], "f60")
    assert hash_tag(key) is None, key
    long_key = counter_key("rl:", "{" + "d" * 300 + "}", [("{u}", "{" * 300)], "f60")
    assert hash_tag(long_key) is None, long_key
