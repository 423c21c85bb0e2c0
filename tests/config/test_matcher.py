"""Descriptor matching (ratelimit-compat.md §2.1) and reference stats keys (§5).

Expectations come from the reference document's examples (basic_config / wildcard cases,
stats-key examples), plus a property test against an independent recursive spec of §2.1.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rls.config.loader import load_files, load_paths
from rls.config.matcher import match, needs_dynamic_stats, stats_key
from rls.config.model import Domain, Unit

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "config"

Entries = list[tuple[str, str]]


@functools.cache
def fixture_domain(name: str, domain: str = "test-domain") -> Domain:
    return load_paths([str(FIXTURES / name)]).domains[domain]


def inline_domain(text: str, domain: str = "d") -> Domain:
    return load_files([("inline.yaml", text)]).domains[domain]


def matched(domain: Domain, entries: Entries):
    path = match(domain, entries)
    assert path is not None, f"expected a limit for {entries}"
    return path[-1].limits[0]


def rpu(domain: Domain, entries: Entries) -> int | None:
    path = match(domain, entries)
    return None if path is None else path[-1].limits[0].requests_per_unit


# --- basic_config.yaml (§2.1 examples) -------------------------------------------------------

NO_LIMIT = [
    [("key1", "something")],
    [("key1", "value1")],  # container only
    [("key2", "value2"), ("subkey", "subvalue")],  # longer than the tree
    [("key5", "value5"), ("subkey5", "subvalue")],  # no match at level 2
    [("key2", "value3")],  # whitelisted: matched node without a limit
    [("key2", "value3"), ("sub", "x")],
    [("key3", "foo"), ("extra", "x")],  # longer than the tree
    [("key1", "value2"), ("subkey1", "x")],  # no default node for key1
    [("nokey", "x")],
    [("KEY2", "x")],  # keys are case-sensitive
    [],
]


@pytest.mark.parametrize("entries", NO_LIMIT, ids=[repr(e) for e in NO_LIMIT])
def test_basic_no_limit(entries: Entries) -> None:
    assert match(fixture_domain("basic_config.yaml"), entries) is None


LIMITED = [
    ([("key1", "value1"), ("subkey1", "something")], 5, Unit.SECOND,
     "test-domain.key1_value1.subkey1"),
    ([("key1", "value1"), ("subkey1", "subvalue1")], 10, Unit.SECOND,
     "test-domain.key1_value1.subkey1_subvalue1"),
    ([("key2", "something")], 20, Unit.MINUTE, "test-domain.key2"),
    ([("key2", "")], 20, Unit.MINUTE, "test-domain.key2"),
    ([("key2", "VALUE2")], 20, Unit.MINUTE, "test-domain.key2"),  # values are case-sensitive
    ([("key2", "value2")], 30, Unit.MINUTE, "test-domain.key2_value2"),
    ([("key3", "foo")], 1, Unit.HOUR, "test-domain.key3"),
    ([("key4", "foo")], 1, Unit.DAY, "test-domain.key4"),
    ([("key5", "value5")], 15, Unit.DAY, "test-domain.key5_value5"),
    ([("key5", "value5"), ("subkey5", "subvalue5")], 25, Unit.DAY,
     "test-domain.key5_value5.subkey5_subvalue5"),
    ([("key7", "unspecified_value")], 70, Unit.MINUTE, "test-domain.key7"),
]


@pytest.mark.parametrize(
    ("entries", "requests", "unit", "full_key"), LIMITED, ids=[repr(c[0]) for c in LIMITED]
)
def test_basic_limits(entries: Entries, requests: int, unit: Unit, full_key: str) -> None:
    lim = matched(fixture_domain("basic_config.yaml"), entries)
    assert (lim.requests_per_unit, lim.unit, lim.full_key) == (requests, unit, full_key)
    assert not lim.unlimited


def test_basic_named_limit() -> None:
    lim = matched(fixture_domain("basic_config.yaml"), [("key4", "foo")])
    assert lim.name == "key4_rate_limit"
    other = matched(fixture_domain("basic_config.yaml"), [("key3", "foo")])
    assert other.name == ""


def test_basic_unlimited() -> None:
    lim = matched(fixture_domain("basic_config.yaml"), [("key6", "foo")])
    assert lim.unlimited


def test_same_limit_object_for_every_default_match() -> None:
    dom = fixture_domain("basic_config.yaml")
    assert matched(dom, [("key2", "a")]) is matched(dom, [("key2", "b")])


def test_static_stats_key_is_full_key() -> None:
    dom = fixture_domain("basic_config.yaml")
    for entries, *_rest, full_key in LIMITED:
        path = match(dom, entries)
        assert path is not None
        if needs_dynamic_stats(path):
            continue
        assert stats_key("test-domain", path, entries) == full_key
    # only key7 (detailed_metric) needs per-request stats keys in this file
    assert not needs_dynamic_stats(match(dom, [("key1", "value1"), ("subkey1", "x")]))
    assert not needs_dynamic_stats(match(dom, [("key2", "x")]))
    assert needs_dynamic_stats(match(dom, [("key7", "x")]))


# --- wildcard.yaml (§2.1 examples) ----------------------------------------------------------

WILDCARD_CASES = [
    ("wild", "foo1", 20, "test-domain.wild_foo*"),
    ("wild", "foo2", 20, "test-domain.wild_foo*"),
    ("wild", "foo", 20, "test-domain.wild_foo*"),  # `*` matches zero characters
    ("wild", "bar", None, None),
    ("wild", "xfoo1", None, None),
    ("noWild", "foo1", None, None),
    ("noWild", "foo", 21, "test-domain.noWild_foo"),
    ("noVal", "anything", 22, "test-domain.noVal"),
    ("midWild", "barab", 23, "test-domain.midWild_bar*b"),
    ("midWild", "bar123b", 23, "test-domain.midWild_bar*b"),
    ("midWild", "barb", 23, "test-domain.midWild_bar*b"),
    ("midWild", "bara", None, None),
    ("midWild", "xbarb", None, None),
    ("midWild", "barbx", None, None),
    ("multiWild", "foo123bar456baz", 24, "test-domain.multiWild_foo*bar*baz"),
    ("multiWild", "foobarbaz", 24, "test-domain.multiWild_foo*bar*baz"),
    ("multiWild", "foo123baz", None, None),
    ("multiWild", "bar456baz", None, None),
    ("multiWild", "foobarbazx", None, None),
    ("file", "test1", 50, "test-domain.file_test1"),  # explicit beats the earlier wildcard
    ("file", "test2", 100, "test-domain.file_test*"),
    ("file", "test", 100, "test-domain.file_test*"),
    ("file", "tes", None, None),
]


@pytest.mark.parametrize(
    ("key", "value", "requests", "full_key"),
    WILDCARD_CASES,
    ids=[f"{k}={v}" for k, v, *_ in WILDCARD_CASES],
)
def test_wildcards(key: str, value: str, requests: int | None, full_key: str | None) -> None:
    dom = fixture_domain("wildcard.yaml")
    path = match(dom, [(key, value)])
    if requests is None:
        assert path is None
        return
    assert path is not None
    lim = path[-1].limits[0]
    assert (lim.requests_per_unit, lim.full_key) == (requests, full_key)


def test_wildcard_matches_share_one_limit_object() -> None:
    dom = fixture_domain("wildcard.yaml")
    assert matched(dom, [("wild", "foo1")]) is matched(dom, [("wild", "foo2")])


def test_nested_wildcard_stats_key() -> None:
    dom = fixture_domain("wildcard.yaml")
    entries = [("nestedWild", "val1"), ("wild", "goo2")]
    lim = matched(dom, entries)
    assert lim.requests_per_unit == 25
    assert lim.full_key == "test-domain.nestedWild_val1.wild_goo*"
    assert match(dom, [("nestedWild", "val1"), ("wild", "foo2")]) is None
    assert match(dom, [("nestedWild", "val2"), ("wild", "goo2")]) is None


def test_share_threshold_flag_on_node() -> None:
    path = match(fixture_domain("wildcard.yaml"), [("file", "test9")])
    assert path is not None and path[-1].share_threshold
    path = match(fixture_domain("wildcard.yaml"), [("file", "test1")])
    assert path is not None and not path[-1].share_threshold


def test_wildcard_key_must_match_exactly() -> None:
    # §2.1: the key must match exactly; a key that merely starts like "wild_foo" is another key
    dom = fixture_domain("wildcard.yaml")
    assert match(dom, [("wild_foo", "1")]) is None
    assert match(dom, [("Wild", "foo1")]) is None


# --- order of preference -------------------------------------------------------------------

def test_explicit_value_beats_wildcard_and_default() -> None:
    dom = inline_domain(
        "domain: d\ndescriptors:\n"
        "  - key: k\n    rate_limit: {unit: second, requests_per_unit: 3}\n"
        "  - key: k\n    value: 'p*'\n    rate_limit: {unit: second, requests_per_unit: 2}\n"
        "  - key: k\n    value: pp\n    rate_limit: {unit: second, requests_per_unit: 1}\n"
    )
    assert rpu(dom, [("k", "pp")]) == 1  # exact, although default and wildcard come first
    assert rpu(dom, [("k", "pz")]) == 2  # wildcard before default
    assert rpu(dom, [("k", "zz")]) == 3  # default last
    assert rpu(dom, [("k", "")]) == 3


@pytest.mark.parametrize("reverse", [False, True])
def test_first_wildcard_in_config_order_wins(reverse: bool) -> None:
    nodes = [
        "  - key: k\n    value: 'p*'\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
        "  - key: k\n    value: '*q'\n    rate_limit: {unit: second, requests_per_unit: 2}\n",
    ]
    if reverse:
        nodes.reverse()
    dom = inline_domain("domain: d\ndescriptors:\n" + "".join(nodes))
    assert rpu(dom, [("k", "pq")]) == (2 if reverse else 1)
    assert rpu(dom, [("k", "pxq")]) == (2 if reverse else 1)
    assert rpu(dom, [("k", "pz")]) == 1
    assert rpu(dom, [("k", "zq")]) == 2
    assert rpu(dom, [("k", "zz")]) is None


def test_no_backtracking_from_explicit_to_default() -> None:
    dom = inline_domain(
        "domain: d\ndescriptors:\n"
        "  - key: a\n    value: x\n    descriptors:\n"
        "      - key: b\n        value: one\n"
        "        rate_limit: {unit: second, requests_per_unit: 1}\n"
        "  - key: a\n    descriptors:\n"
        "      - key: b\n        rate_limit: {unit: second, requests_per_unit: 2}\n"
    )
    assert rpu(dom, [("a", "x"), ("b", "one")]) == 1
    assert rpu(dom, [("a", "x"), ("b", "two")]) is None  # does not fall back to a's default
    assert rpu(dom, [("a", "y"), ("b", "two")]) == 2
    assert rpu(dom, [("a", "y"), ("b", "one")]) == 2


def test_no_backtracking_from_wildcard_to_default_or_later_wildcard() -> None:
    dom = inline_domain(
        "domain: d\ndescriptors:\n"
        "  - key: a\n    value: 'x*'\n    descriptors:\n"
        "      - key: b\n        value: one\n"
        "        rate_limit: {unit: second, requests_per_unit: 1}\n"
        "  - key: a\n    value: '*y'\n    descriptors:\n"
        "      - key: b\n        rate_limit: {unit: second, requests_per_unit: 3}\n"
        "  - key: a\n    descriptors:\n"
        "      - key: b\n        rate_limit: {unit: second, requests_per_unit: 2}\n"
    )
    assert rpu(dom, [("a", "xy"), ("b", "one")]) == 1
    assert rpu(dom, [("a", "xy"), ("b", "two")]) is None
    assert rpu(dom, [("a", "zy"), ("b", "two")]) == 3
    assert rpu(dom, [("a", "zz"), ("b", "two")]) == 2


def test_depth_must_match() -> None:
    dom = inline_domain(
        "domain: d\ndescriptors:\n"
        "  - key: a\n    descriptors:\n"
        "      - key: b\n        descriptors:\n"
        "          - key: c\n            rate_limit: {unit: second, requests_per_unit: 1}\n"
    )
    assert rpu(dom, [("a", "1"), ("b", "2"), ("c", "3")]) == 1
    assert rpu(dom, [("a", "1")]) is None
    assert rpu(dom, [("a", "1"), ("b", "2")]) is None
    assert rpu(dom, [("a", "1"), ("b", "2"), ("c", "3"), ("d", "4")]) is None
    assert rpu(dom, [("b", "2"), ("c", "3")]) is None  # order of entries matters
    assert rpu(dom, [("a", "1"), ("c", "3"), ("b", "2")]) is None


# --- stats keys: detailed_metric and value_to_metric ----------------------------------------

@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("unspecified_value", "test-domain.key7_unspecified_value"),
        ("another_value", "test-domain.key7_another_value"),
        ("", "test-domain.key7_"),  # empty value keeps the trailing underscore
    ],
)
def test_detailed_metric_stats_key(value: str, expected: str) -> None:
    entries = [("key7", value)]
    path = match(fixture_domain("basic_config.yaml"), entries)
    assert path is not None
    assert needs_dynamic_stats(path)
    assert stats_key("test-domain", path, entries) == expected
    assert path[-1].limits[0].full_key == "test-domain.key7"


def test_detailed_metric_uses_every_request_entry() -> None:
    dom = inline_domain(
        "domain: d\ndescriptors:\n"
        "  - key: outer\n    descriptors:\n"
        "      - key: inner\n        detailed_metric: true\n"
        "        rate_limit: {unit: second, requests_per_unit: 1}\n"
        "  - key: k1\n    value: v1\n    descriptors:\n"
        "      - key: k2\n        detailed_metric: true\n"
        "        rate_limit: {unit: second, requests_per_unit: 1}\n"
    )
    entries = [("outer", "o1"), ("inner", "i1")]
    path = match(dom, entries)
    assert path is not None and needs_dynamic_stats(path)
    assert stats_key("d", path, entries) == "d.outer_o1.inner_i1"
    entries = [("k1", "v1"), ("k2", "xyz")]
    path = match(dom, entries)
    assert path is not None
    assert stats_key("d", path, entries) == "d.k1_v1.k2_xyz"


def test_value_to_metric_on_two_levels() -> None:
    dom = fixture_domain("value_to_metric.yaml", "domain")
    entries = [("route", "draw"), ("http_method", "GET"), ("subject_id", "123")]
    path = match(dom, entries)
    assert path is not None
    assert needs_dynamic_stats(path)
    assert stats_key("domain", path, entries) == "domain.route_draw.http_method_GET.subject_id"
    assert path[-1].limits[0].full_key == "domain.route.http_method.subject_id"
    assert path[-1].limits[0].requests_per_unit == 60


def test_value_to_metric_on_middle_level_only() -> None:
    dom = inline_domain(
        "domain: d\ndescriptors:\n"
        "  - key: k1\n    descriptors:\n"
        "      - key: k2\n        value_to_metric: true\n        descriptors:\n"
        "          - key: k3\n            rate_limit: {unit: second, requests_per_unit: 1}\n"
    )
    entries = [("k1", "X"), ("k2", "Y"), ("k3", "Z")]
    path = match(dom, entries)
    assert path is not None
    assert stats_key("d", path, entries) == "d.k1.k2_Y.k3"


def test_value_to_metric_with_wildcard_uses_request_value() -> None:
    dom = inline_domain(
        "domain: d\ndescriptors:\n"
        "  - key: k\n    value: 'p*'\n    value_to_metric: true\n"
        "    rate_limit: {unit: second, requests_per_unit: 1}\n"
    )
    entries = [("k", "pqr")]
    path = match(dom, entries)
    assert path is not None and needs_dynamic_stats(path)
    assert stats_key("d", path, entries) == "d.k_pqr"


def test_value_to_metric_with_share_threshold_uses_pattern() -> None:
    dom = inline_domain(
        "domain: test-domain\ndescriptors:\n"
        "  - key: service\n    value: 'svc/*'\n    share_threshold: true\n"
        "    value_to_metric: true\n    descriptors:\n"
        "      - key: endpoint\n        value_to_metric: true\n"
        "        rate_limit: {unit: second, requests_per_unit: 1}\n",
        "test-domain",
    )
    entries = [("service", "svc/users"), ("endpoint", "get")]
    path = match(dom, entries)
    assert path is not None
    assert stats_key("test-domain", path, entries) == "test-domain.service_svc/*.endpoint_get"


def test_value_to_metric_on_explicit_value_is_static() -> None:
    dom = inline_domain(
        "domain: d\ndescriptors:\n"
        "  - key: k\n    value: v\n    value_to_metric: true\n"
        "    rate_limit: {unit: second, requests_per_unit: 1}\n"
    )
    entries = [("k", "v")]
    path = match(dom, entries)
    assert path is not None
    assert not needs_dynamic_stats(path)
    assert stats_key("d", path, entries) == "d.k_v" == path[-1].limits[0].full_key


# --- property: rls.match agrees with a direct recursive reading of §2.1 ----------------------

KEYS = ("a", "b")
CHARS = "pqr"  # no YAML-special words and no "_" (rls keeps (key, value) pairs distinct)
UNITS = ("second", "minute", "hour", "day")


def glob(pattern: str, text: str) -> bool:
    """`*` matches any run of characters (possibly empty); every other character is literal."""
    if not pattern:
        return not text
    if pattern[0] == "*":
        return any(glob(pattern[1:], text[i:]) for i in range(len(text) + 1))
    return bool(text) and text[0] == pattern[0] and glob(pattern[1:], text[1:])


def spec_match(level: list[dict[str, Any]], entries: Entries) -> list[dict[str, Any]] | None:
    """§2.1 step 3: exact `key_value`, else first wildcard in config order, else default key;
    the last entry needs a limit, earlier entries descend into children (no backtracking)."""
    if not entries:
        return None
    key, value = entries[0]
    same_key = [n for n in level if n["key"] == key]
    node = next((n for n in same_key if n["value"] and n["value"] == value), None)
    if node is None:
        node = next(
            (n for n in same_key if "*" in n["value"] and glob(n["value"], value)), None
        )
    if node is None:
        node = next((n for n in same_key if n["value"] == ""), None)
    if node is None:
        return None
    if len(entries) == 1:
        return [node] if node["limit"] is not None else None
    if not node["children"]:
        return None
    rest = spec_match(node["children"], entries[1:])
    return None if rest is None else [node, *rest]


values_st = st.text(alphabet=CHARS, min_size=1, max_size=3)
patterns_st = st.lists(st.sampled_from(CHARS + "*"), min_size=1, max_size=4).map("".join).filter(
    lambda s: "*" in s
)


@st.composite
def levels(draw: st.DrawFn, depth: int = 0) -> list[dict[str, Any]]:
    nodes: list[dict[str, Any]] = []
    seen: set[tuple[str, str]] = set()
    for _ in range(draw(st.integers(0, 6 if depth == 0 else 4))):
        key = draw(st.sampled_from(KEYS))
        value = draw(st.one_of(st.just(""), values_st, patterns_st))
        if (key, value) in seen:
            continue
        seen.add((key, value))
        has_limit = draw(st.integers(0, 3)) > 0
        children = draw(levels(depth + 1)) if depth < 2 and draw(st.booleans()) else []
        nodes.append(
            {
                "key": key,
                "value": value,
                "value_style": draw(st.sampled_from(["omit", "empty", "null"])),
                "limit": {"unit": draw(st.sampled_from(UNITS))} if has_limit else None,
                "children": children,
            }
        )
    return nodes


def number_limits(level: list[dict[str, Any]], counter: list[int]) -> None:
    for node in level:
        if node["limit"] is not None:
            counter[0] += 1
            node["limit"]["requests_per_unit"] = counter[0]
        number_limits(node["children"], counter)


def to_yaml_nodes(level: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for node in level:
        item: dict[str, Any] = {"key": node["key"]}
        if node["value"]:
            item["value"] = node["value"]
        elif node["value_style"] == "empty":
            item["value"] = ""
        elif node["value_style"] == "null":
            item["value"] = None
        if node["limit"] is not None:
            item["rate_limit"] = dict(node["limit"])
        if node["children"]:
            item["descriptors"] = to_yaml_nodes(node["children"])
        out.append(item)
    return out


def instances(value: str) -> list[str]:
    """Request values a node is likely to see: itself, and strings its pattern matches."""
    return [value, value.replace("*", ""), value.replace("*", "pq"), value.replace("*", "r*")]


def draw_entries(data: st.DataObject, tree: list[dict[str, Any]]) -> Entries:
    """Mostly a walk down the tree with small mutations (so deep matches are common),
    sometimes entirely random entries."""
    value_st = st.text(alphabet=CHARS + "*", max_size=4)
    if data.draw(st.integers(0, 3), label="random") == 0:
        return data.draw(st.lists(st.tuples(st.sampled_from(KEYS), value_st), max_size=4))
    entries: Entries = []
    level = tree
    length = data.draw(st.integers(1, 4), label="length")
    while level and len(entries) < length:
        node = data.draw(st.sampled_from(level), label="node")
        key = node["key"]
        if data.draw(st.integers(0, 9), label="mutate key") == 0:
            key = data.draw(st.sampled_from(KEYS))
        if data.draw(st.integers(0, 4), label="mutate value") == 0:
            value = data.draw(value_st)
        else:
            value = data.draw(st.sampled_from(instances(node["value"])), label="value")
        entries.append((key, value))
        level = node["children"]
    if data.draw(st.integers(0, 5), label="extra") == 0:
        entries.append((data.draw(st.sampled_from(KEYS)), data.draw(value_st)))
    return entries


@settings(
    max_examples=400,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(tree=levels(), data=st.data())
def test_match_agrees_with_spec(tree: list[dict[str, Any]], data: st.DataObject) -> None:
    number_limits(tree, [0])
    text = yaml.safe_dump({"domain": "d", "descriptors": to_yaml_nodes(tree)}, sort_keys=False)
    domain = load_files([("prop.yaml", text)]).domains["d"]

    for _ in range(8):
        entries = draw_entries(data, tree)
        expected = spec_match(tree, entries)
        got = match(domain, entries)
        if expected is None:
            assert got is None, f"{entries}: expected no limit\n{text}"
            continue
        assert got is not None, f"{entries}: expected a limit\n{text}"
        assert [(n.key, n.value) for n in got] == [(n["key"], n["value"]) for n in expected]
        lim = got[-1].limits[0]
        assert lim.requests_per_unit == expected[-1]["limit"]["requests_per_unit"]
        assert lim.unit is Unit[expected[-1]["limit"]["unit"].upper()]
        full_key = ".".join(
            ["d"] + [f"{n['key']}_{n['value']}" if n["value"] else n["key"] for n in expected]
        )
        assert lim.full_key == full_key
        assert not needs_dynamic_stats(got)
        assert stats_key("d", got, entries) == full_key


def test_value_to_metric_with_an_empty_value_names_the_key_alone() -> None:
    dom = inline_domain(
        "domain: sd\ndescriptors:\n"
        "  - key: route\n    value_to_metric: true\n    descriptors:\n"
        "      - key: method\n        rate_limit: {unit: second, requests_per_unit: 1}\n",
        "sd",
    )
    entries = [("route", ""), ("method", "GET")]
    path = match(dom, entries)
    assert path is not None and needs_dynamic_stats(path)
    assert stats_key("sd", path, entries) == "sd.route.method"  # not sd.route_.method


def test_detailed_metric_with_share_threshold_keeps_the_wildcard() -> None:
    dom = inline_domain(
        "domain: test-domain\ndescriptors:\n"
        "  - key: service\n    value: 'svc/*'\n    share_threshold: true\n    descriptors:\n"
        "      - key: endpoint\n        detailed_metric: true\n"
        "        rate_limit: {unit: second, requests_per_unit: 1}\n",
        "test-domain",
    )
    entries = [("service", "svc/users"), ("endpoint", "get")]
    path = match(dom, entries)
    assert path is not None and needs_dynamic_stats(path)
    assert stats_key("test-domain", path, entries) == "test-domain.service_svc/*.endpoint_get"
