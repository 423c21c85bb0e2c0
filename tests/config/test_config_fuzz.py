"""Fuzz the descriptor YAML loader: any text either loads or raises ConfigError whose message
reads `f.yaml: …` (DESIGN §10: a bad file keeps the old config and logs `file: message`; an
exception of any other type would escape the reloader instead).

Three generators: near-valid configs built from the schema (every key of the reference and the
extensions, with right and wrong types mixed in), random YAML trees (random nesting, key names
from the valid set plus junk, non-string keys, every scalar type), and either of them with
YAML syntax spliced into the text (anchors, aliases, tags, merge keys, flow brackets, tabs,
BOMs, NULs, document markers).
"""

from __future__ import annotations

import traceback

import pytest
import yaml
from hypothesis import HealthCheck, event, given, reject, settings
from hypothesis import strategies as st

from rls.config.errors import ConfigError
from rls.config.loader import load_files
from rls.config.parser import VALID_KEYS

# The repr of the nested schema strategy is large; hypothesis warns about it, harmlessly.
pytestmark = pytest.mark.filterwarnings("ignore:Generating overly large repr")

FILE = "f.yaml"
FUZZ = settings(max_examples=120, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])

# Defects this fuzzer found are fixed (docs/reliability.md, "Bugs found and fixed"); no
# exception signature is set aside any more: every non-ConfigError fails the test.
KNOWN: set[tuple[str, str]] = set()
known_hits: list[str] = []

UNITS = ["second", "minute", "hour", "day", "week", "month", "year", "SECOND", "Minute",
         "fortnight", "unknown", ""]
ALGORITHMS = ["fixed_window", "sliding_window", "sliding_log", "token_bucket", "leaky_bucket",
              "gcra", "concurrency", "bogus"]
WORDS = st.sampled_from(
    [*UNITS, *ALGORITHMS, "*", "a*", "*b*", "always", "on_allow", "allow", "deny", "UTC",
     "Asia/Shanghai", "Europe/Berlin", "Bad/Zone", "../etc", "yes", "no", "on", "0x1F", "1e3",
     "007", "-1", "~", "null", "a|b", "x%y#z{w}", "k_v", "é", "😀", "a,b", " app , user "]
)
SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=10), WORDS,
)
JUNK_KEYS = st.one_of(
    st.text(max_size=6), st.integers(-5, 5), st.booleans(), st.none(),
    st.floats(allow_nan=False), st.sampled_from(["days", "calls", "distinct", "per", "Key"]),
)
KEYS = st.one_of(st.sampled_from(sorted(VALID_KEYS)), JUNK_KEYS)
ANY = st.recursive(
    SCALARS,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(KEYS, children, max_size=4),
    max_leaves=12,
)


def sometimes(strategy: st.SearchStrategy) -> st.SearchStrategy:
    """Mostly the right kind of value, sometimes anything."""
    return st.one_of(strategy, strategy, strategy, ANY)


UINT = st.one_of(st.integers(0, 20), st.sampled_from([0, 1, 4294967295, 4294967296, -1]))
LIMIT = st.fixed_dictionaries(
    {},
    optional={
        "unit": sometimes(st.sampled_from(UNITS)),
        "requests_per_unit": sometimes(UINT),
        "unlimited": sometimes(st.booleans()),
        "name": sometimes(st.sampled_from(["a", "b", "lim", ""])),
        "replaces": sometimes(st.lists(st.fixed_dictionaries(
            {}, optional={"name": sometimes(st.sampled_from(["a", "b", "", "lim"]))}
        ), max_size=2)),
        "algorithm": sometimes(st.sampled_from(ALGORITHMS)),
        "unit_multiplier": sometimes(UINT),
        "burst": sometimes(UINT),
        "overdraft": sometimes(UINT),
        "calendar": sometimes(st.booleans()),
        "timezone": sometimes(st.sampled_from(["UTC", "Asia/Shanghai", "Bad/Zone", ""])),
        "charge": sometimes(st.sampled_from(["always", "on_allow", "never"])),
    },
)
DESCRIPTOR_FIELDS = {
    "key": sometimes(st.sampled_from(["k", "user", "path", "", "a_b", "a|b"])),
    "value": sometimes(st.sampled_from(["v", "*", "a*", "", "b_c", "x%y"])),
    "rate_limit": sometimes(LIMIT),
    "rate_limits": sometimes(st.lists(LIMIT, max_size=3)),
    "shadow_mode": sometimes(st.booleans()),
    "quota_mode": sometimes(st.booleans()),
    "detailed_metric": sometimes(st.booleans()),
    "value_to_metric": sometimes(st.booleans()),
    "share_threshold": sometimes(st.booleans()),
    "metadata": ANY,
}
DESCRIPTOR = st.recursive(
    st.fixed_dictionaries({}, optional=DESCRIPTOR_FIELDS),
    lambda children: st.fixed_dictionaries(
        {}, optional={**DESCRIPTOR_FIELDS, "descriptors": st.lists(children, max_size=3)}
    ),
    max_leaves=6,
)
USAGE = st.fixed_dictionaries(
    {},
    optional={
        "days": sometimes(st.integers(-1, 4000)),
        "timezone": sometimes(st.sampled_from(["UTC", "Asia/Shanghai", "Bad/Zone"])),
        "calls": sometimes(st.lists(sometimes(st.sampled_from(["app", "app,user", ""])),
                                    max_size=3)),
        "distinct": sometimes(st.lists(st.fixed_dictionaries(
            {}, optional={"key": sometimes(st.just("user")), "per": sometimes(st.just("app"))}
        ), max_size=2)),
    },
)
CONFIG = st.fixed_dictionaries(
    {"domain": sometimes(st.sampled_from(["d", "", "gateway", "é"]))},
    optional={
        "descriptors": sometimes(st.lists(DESCRIPTOR, max_size=4)),
        "failure_mode": sometimes(st.sampled_from(["allow", "deny", "maybe"])),
        "usage_stats": sometimes(USAGE),
    },
)
SPLICES = st.sampled_from(
    ["&a ", "*a", "&a [*a]", "!!binary ", "!!set ", "!!timestamp ", "!!float ", "!!str ",
     "!!python/object:os.system ", "<<: ", "<<: *a", "\t", ": ", "- ", "[", "]", "{", "}",
     "'", '"', "\n  ", "\n- ", "#", "%YAML 1.1\n", "---\n", "...\n", "\x00", "\ufeff", "?",
     "|\n", ">-\n", "\\", "\r\n", "\x85", "\ud7ff", "0o17", "-.inf", ".nan", "~"]
)


def dump(doc: object, unicode: bool) -> str:
    return yaml.safe_dump(doc, sort_keys=False, allow_unicode=unicode, default_flow_style=None)


@st.composite
def spliced(draw: st.DrawFn, base: st.SearchStrategy) -> str:
    text = dump(draw(base), draw(st.booleans()))
    for _ in range(draw(st.integers(1, 4))):
        pos = draw(st.integers(0, len(text)))
        if draw(st.booleans()):
            text = text[:pos] + draw(SPLICES) + text[pos:]
        else:
            text = text[:pos] + text[pos + draw(st.integers(1, 5)):]
    return text


def innermost_rls_function(exc: BaseException) -> str:
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "/rls/" in f.filename]
    return frames[-1].name if frames else "?"


def check(text: str) -> None:
    try:
        config = load_files([(FILE, text)])
    except ConfigError as exc:
        event("ConfigError")
        assert str(exc).startswith(f"{FILE}: "), str(exc)
        assert exc.file == FILE and exc.message and str(exc) == f"{FILE}: {exc.message}"
        return
    except Exception as exc:  # anything else is the bug this test looks for
        kind, where = type(exc).__name__, innermost_rls_function(exc)
        if {(kind, where), (kind, "*"), ("*", where)} & KNOWN:
            known_hits.append(f"{kind} in {where}: {text[:200]!r}")
            reject()
        raise AssertionError(
            f"{kind} (not ConfigError) from {where} for:\n{text}\n{traceback.format_exc()}"
        ) from exc
    event("loaded")
    assert config.files == (FILE,) and len(config.domains) == 1


@FUZZ
@given(doc=CONFIG, unicode=st.booleans())
def test_schema_shaped_configs(doc, unicode):
    check(dump(doc, unicode))


@FUZZ
@given(doc=st.one_of(ANY, st.dictionaries(KEYS, ANY, max_size=6)), unicode=st.booleans())
def test_random_yaml_trees(doc, unicode):
    check(dump(doc, unicode))


@FUZZ
@given(text=st.one_of(spliced(CONFIG), spliced(ANY), st.text(max_size=80)))
def test_yaml_syntax_splices(text):
    check(text)


def test_known_valid_config_still_loads():
    """The generators are not vacuous: a config of the same shapes loads."""
    doc = {"domain": "d", "failure_mode": "deny",
           "usage_stats": {"days": 3, "calls": ["app"], "distinct": [{"key": "user"}]},
           "descriptors": [{"key": "k", "value": "a*", "share_threshold": True,
                            "rate_limits": [{"unit": "second", "requests_per_unit": 1},
                                            {"unit": "day", "requests_per_unit": 9,
                                             "algorithm": "gcra", "burst": 3}]}]}
    config = load_files([(FILE, dump(doc, True))])
    assert set(config.domains) == {"d"}


# -- regressions: defects the fuzzer found (fixed), pinned by explicit inputs ------------------


class KnownBug(AssertionError):
    """A defect the fuzzer once found is back (fixed; these tests keep it fixed)."""


def expect_config_error(text: str) -> None:
    try:
        load_files([(FILE, text)])
    except ConfigError as exc:
        assert str(exc).startswith(f"{FILE}: ")
        return
    except Exception as exc:
        raise KnownBug(f"{type(exc).__name__} instead of ConfigError: {exc}") from exc


BUG_MIXED_KEYS = (
    "FIXED: parse_usage_stats sorts the unknown keys of usage_stats; keys of mixed types "
    "(5 and 'x', true and 'x', null and 'x') raise TypeError instead of ConfigError"
)
BUG_TAGGED_SCALARS = (
    "FIXED: parse_yaml catches only yaml.YAMLError, but PyYAML's constructors raise ValueError, "
    "IndexError, KeyError or AttributeError for explicitly tagged scalars they cannot convert "
    "(`!!float ;`, `!!int x`, `!!bool x`, `!!timestamp x`, an empty `!!float`)"
)
BUG_RECURSION = (
    "FIXED: deeply nested documents (about 300 nested descriptors, 500 nested lists) and "
    "recursive aliases (&a [{key: k, descriptors: *a}]) raise RecursionError instead of "
    "ConfigError; in `rls serve` the exception escapes ConfigHolder.reload (it catches only "
    "ConfigError)"
)


@pytest.mark.parametrize("keys", ["{5: 1, x: 2}", "{true: 1, x: 2}", "{~: 1, x: 2}"])
def test_usage_stats_keys_of_mixed_types(keys):
    expect_config_error(f"domain: d\nusage_stats: {keys}\n")


@pytest.mark.parametrize("text", [
    "!!float", "domain: !!float ;", "domain: !!int x", "domain: !!int 0x", "domain: !!bool x",
    "domain: !!timestamp x", "domain: d\ndescriptors: [{key: k, value: !!int ___}]",
])
def test_tagged_scalars_that_do_not_convert(text):
    expect_config_error(text)


@pytest.mark.parametrize("text", [
    "domain: d\ndescriptors: " + "[{key: k, descriptors: " * 300 + "[]" + "}]" * 300,
    "domain: d\ndescriptors: " + "[" * 500 + "]" * 500,
    "domain: d\ndescriptors: &a [ {key: k, descriptors: *a} ]\n",
], ids=["300-nested-descriptors", "500-nested-lists", "recursive-alias"])
def test_pathological_nesting(text):
    expect_config_error(text)
