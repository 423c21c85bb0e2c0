"""Descriptor config loading and validation (ratelimit-compat.md §1, DESIGN §5).

Every expected message below is taken from the reference table in ratelimit-compat.md §1.3
(`<file>: <message>`), not from rls's output.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from rls.config.errors import ConfigError
from rls.config.loader import load_files, load_paths
from rls.config.matcher import match
from rls.config.model import Unit

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "config"
BAD = FIXTURES / "bad"
GOOD = FIXTURES / "good"
MERGE = FIXTURES / "merge"


def load_error(paths: list[Path], merge_domains: bool = False) -> str:
    with pytest.raises(ConfigError) as info:
        load_paths([str(p) for p in paths], merge_domains=merge_domains)
    return str(info.value)


def text_error(text: str, name: str = "inline.yaml") -> str:
    with pytest.raises(ConfigError) as info:
        load_files([(name, text)])
    return str(info.value)


def limit_of(config, domain: str, *entries: tuple[str, str]):
    path = match(config.domains[domain], list(entries))
    assert path is not None, f"no limit for {entries}"
    return path[-1].limits[0]


def one_limit(rate_limit_yaml: str, domain: str = "d"):
    """Load a one-node config whose rate_limit body is `rate_limit_yaml` (already indented)."""
    text = f"domain: {domain}\ndescriptors:\n  - key: k\n    rate_limit:\n{rate_limit_yaml}"
    config = load_files([("one.yaml", text)])
    return limit_of(config, domain, ("k", "v"))


# --- the reference table, one fixture per condition -------------------------------------------

EXACT_MESSAGES = [
    ("misspelled_key.yaml", "config error, unknown key 'ratelimit'"),
    ("misspelled_key2.yaml", "config error, unknown key 'requestsperunit'"),
    ("non_string_key.yaml", "config error, key is not of type string: 0.25"),
    ("non_map_list.yaml", "config error, yaml file contains list of type other than map: a"),
    ("float_leaf.yaml", "error checking config"),
    ("empty_domain.yaml", "config file cannot have empty domain"),
    ("missing_domain.yaml", "config file cannot have empty domain"),
    ("empty_key.yaml", "descriptor has empty key"),
    ("duplicate_key.yaml", "duplicate descriptor composite key 'test-domain.key1_value1'"),
    (
        "duplicate_key_nested.yaml",
        "duplicate descriptor composite key 'test-domain.key1_value1.subkey1'",
    ),
    ("bad_limit_unit.yaml", "invalid rate limit unit 'foo'"),
    ("missing_unit.yaml", "invalid rate limit unit ''"),
    ("unlimited_with_unit.yaml", "should not specify rate limit unit when unlimited"),
    ("replaces_empty.yaml", "should not have an empty replaces entry"),
    ("replaces_self.yaml", "replaces should not contain name of same descriptor"),
    (
        "share_threshold_no_wildcard.yaml",
        "share_threshold can only be used with wildcard values (containing '*'), "
        "but found key 'key1_value1'",
    ),
]


@pytest.mark.parametrize(("fixture", "message"), EXACT_MESSAGES, ids=[f for f, _ in EXACT_MESSAGES])
def test_reference_validation_message(fixture: str, message: str) -> None:
    path = BAD / fixture
    assert load_error([path]) == f"{path}: {message}"


PREFIX_MESSAGES = [
    ("bad_yaml.yaml", "error loading config file: "),
    ("rpu_not_int.yaml", "error loading config file: yaml: unmarshal errors:"),
    ("rpu_negative.yaml", "error loading config file: yaml: unmarshal errors:"),
]


@pytest.mark.parametrize(
    ("fixture", "prefix"), PREFIX_MESSAGES, ids=[f for f, _ in PREFIX_MESSAGES]
)
def test_yaml_and_unmarshal_errors(fixture: str, prefix: str) -> None:
    path = BAD / fixture
    assert load_error([path]).startswith(f"{path}: {prefix}")


def test_configerror_carries_file_and_message() -> None:
    path = BAD / "empty_key.yaml"
    with pytest.raises(ConfigError) as info:
        load_paths([str(path)])
    assert info.value.file == str(path)
    assert info.value.message == "descriptor has empty key"


@pytest.mark.parametrize(
    "body",
    [
        "      unit: second\n      requests_per_unit: 4294967296\n",  # > uint32
        "      unit: second\n      requests_per_unit: true\n",
        "      unit: second\n      requests_per_unit: 5\n      unlimited: abc\n",
    ],
    ids=["rpu-overflows-uint32", "rpu-bool", "unlimited-not-bool"],
)
def test_more_typed_unmarshal_errors(body: str) -> None:
    text = f"domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n{body}"
    assert text_error(text).startswith(
        "inline.yaml: error loading config file: yaml: unmarshal errors:"
    )


def test_unknown_key_at_root_and_deep_inside() -> None:
    assert text_error("domain: d\nratelimits: []\n") == (
        "inline.yaml: config error, unknown key 'ratelimits'"
    )
    deep = (
        "domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - key: b\n"
        "        descriptors:\n          - key: c\n            rate_limit:\n"
        "              unit: second\n              requests_per_unit: 1\n"
        "              replaces:\n                - name: x\n                  nmae: y\n"
    )
    assert text_error(deep) == "inline.yaml: config error, unknown key 'nmae'"


def test_non_string_integer_key() -> None:
    assert text_error("domain: d\ndescriptors:\n  - key: k\n    1: x\n") == (
        "inline.yaml: config error, key is not of type string: 1"
    )


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("  - key: k\n    ~: x\n", "config error, key is not of type string: <nil>"),
        ("  - key: k\n    true: x\n", "config error, key is not of type string: true"),
        ("  - 5\n", "config error, yaml file contains list of type other than map: 5"),
        ("  - [a, b]\n", "config error, yaml file contains list of type other than map: [a b]"),
    ],
    ids=["null-key", "bool-key", "int-item", "list-item"],
)
def test_offending_element_rendered_like_go(body: str, message: str) -> None:
    """The reference formats the offending key / list element with Go's `%v`."""
    assert text_error(f"domain: d\ndescriptors:\n{body}") == f"inline.yaml: {message}"


def test_empty_file_has_empty_domain() -> None:
    assert text_error("") == "inline.yaml: config file cannot have empty domain"
    assert text_error("# only a comment\n") == "inline.yaml: config file cannot have empty domain"


def test_empty_string_key() -> None:
    text = "domain: d\ndescriptors:\n  - key: ''\n    rate_limit: {unit: second}\n"
    assert text_error(text) == "inline.yaml: descriptor has empty key"


def test_share_threshold_on_default_key_names_the_key() -> None:
    text = (
        "domain: d\ndescriptors:\n  - key: k\n    share_threshold: true\n"
        "    rate_limit: {unit: second, requests_per_unit: 1}\n"
    )
    assert text_error(text) == (
        "inline.yaml: share_threshold can only be used with wildcard values (containing '*'), "
        "but found key 'k'"
    )


def test_share_threshold_with_wildcard_is_fine() -> None:
    text = (
        "domain: d\ndescriptors:\n  - key: k\n    value: 'files/*'\n    share_threshold: true\n"
        "    rate_limit: {unit: second, requests_per_unit: 1}\n"
    )
    config = load_files([("ok.yaml", text)])
    assert limit_of(config, "d", ("k", "files/a")).requests_per_unit == 1


def test_replaces_entry_without_name_key() -> None:
    text = (
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      name: a\n"
        "      unit: second\n      replaces:\n        - {}\n"
    )
    assert text_error(text) == "inline.yaml: should not have an empty replaces entry"


def test_replaces_other_names_is_fine() -> None:
    lim = one_limit(
        "      name: a\n      unit: second\n      requests_per_unit: 3\n"
        "      replaces:\n        - name: b\n        - name: c\n"
    )
    assert lim.name == "a"
    assert set(lim.replaces) == {"b", "c"}


# --- units ----------------------------------------------------------------------------------

UNIT_CASES = [
    ("second", Unit.SECOND, 1),
    ("SECOND", Unit.SECOND, 1),
    ("minute", Unit.MINUTE, 60),
    ("Minute", Unit.MINUTE, 60),
    ("MINUTE", Unit.MINUTE, 60),
    ("hour", Unit.HOUR, 3600),
    ("HOUR", Unit.HOUR, 3600),
    ("Day", Unit.DAY, 86400),
    ("DAY", Unit.DAY, 86400),
    ("week", Unit.WEEK, 604800),
    ("WEEK", Unit.WEEK, 604800),
    ("month", Unit.MONTH, 2592000),  # 30 days, not a calendar month
    ("MONTH", Unit.MONTH, 2592000),
    ("yEaR", Unit.YEAR, 31536000),  # 365 days
    ("YEAR", Unit.YEAR, 31536000),
]


@pytest.mark.parametrize(("text", "unit", "seconds"), UNIT_CASES, ids=[c[0] for c in UNIT_CASES])
def test_units_any_case(text: str, unit: Unit, seconds: int) -> None:
    lim = one_limit(f"      unit: {text}\n      requests_per_unit: 7\n")
    assert lim.unit is unit
    assert lim.requests_per_unit == 7
    assert not lim.unlimited
    assert lim.window_seconds == seconds


def test_unit_enum_numbering_matches_envoy() -> None:
    assert [int(Unit[n]) for n in ("UNKNOWN", "SECOND", "MINUTE", "HOUR", "DAY", "MONTH",
                                   "YEAR", "WEEK")] == [0, 1, 2, 3, 4, 5, 6, 7]


@pytest.mark.parametrize("bad", ["unknown", "UNKNOWN", "seconds", "min", "1"])
def test_unknown_unit_names_rejected(bad: str) -> None:
    text = f"domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: '{bad}'\n"
    assert text_error(text) == f"inline.yaml: invalid rate limit unit '{bad}'"


def test_missing_requests_per_unit_is_zero() -> None:
    assert one_limit("      unit: second\n").requests_per_unit == 0


def test_requests_per_unit_uint32_max_is_accepted() -> None:
    lim = one_limit("      unit: second\n      requests_per_unit: 4294967295\n")
    assert lim.requests_per_unit == 4294967295


def test_unlimited_without_unit() -> None:
    lim = one_limit("      unlimited: true\n")
    assert lim.unlimited


def test_unlimited_with_invalid_unit_is_accepted() -> None:
    # quirk listed in §1.3: only a *valid* unit is rejected together with unlimited
    lim = one_limit("      unlimited: true\n      unit: foo\n")
    assert lim.unlimited


# --- documents, values, keys ----------------------------------------------------------------

def test_only_first_yaml_document_is_read() -> None:
    text = (
        "domain: first\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, "
        "requests_per_unit: 1}\n---\ndomain: second\nbogus_key: 1\ndescriptors:\n  - nope\n"
    )
    config = load_files([("multi.yaml", text)])
    assert set(config.domains) == {"first"}


def test_empty_value_equals_no_value() -> None:
    text = (
        "domain: d\ndescriptors:\n  - key: k\n    value: ''\n"
        "    rate_limit: {unit: second, requests_per_unit: 4}\n"
    )
    config = load_files([("v.yaml", text)])
    # behaves as the key-only default node: any value matches
    assert limit_of(config, "d", ("k", "anything")).requests_per_unit == 4
    assert limit_of(config, "d", ("k", "")).requests_per_unit == 4
    assert limit_of(config, "d", ("k", "anything")).full_key == "d.k"


def test_empty_value_and_missing_value_are_duplicates() -> None:
    text = (
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second}\n"
        "  - key: k\n    value: ''\n    rate_limit: {unit: minute}\n"
    )
    assert text_error(text) == "inline.yaml: duplicate descriptor composite key 'd.k'"


def test_same_key_different_values_are_not_duplicates() -> None:
    text = (
        "domain: d\ndescriptors:\n  - key: k\n    value: a\n    rate_limit: {unit: second}\n"
        "  - key: k\n    value: b\n    rate_limit: {unit: second}\n"
        "  - key: k\n    rate_limit: {unit: second}\n"
    )
    load_files([("ok.yaml", text)])


def test_same_node_at_different_levels_is_not_a_duplicate() -> None:
    text = (
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second}\n"
        "    descriptors:\n      - key: k\n        rate_limit: {unit: minute}\n"
    )
    load_files([("ok.yaml", text)])


def test_underscore_split_is_not_a_duplicate_in_rls() -> None:
    """Deliberate rls difference (per the brief): duplicates compare the real (key, value) pair.

    The reference joins `key_value` and would reject these two nodes as `'d.a_b_c'`.
    """
    text = (
        "domain: d\ndescriptors:\n  - key: a\n    value: b_c\n"
        "    rate_limit: {unit: second, requests_per_unit: 1}\n"
        "  - key: a_b\n    value: c\n    rate_limit: {unit: second, requests_per_unit: 2}\n"
    )
    config = load_files([("ok.yaml", text)])
    assert limit_of(config, "d", ("a", "b_c")).requests_per_unit == 1
    assert limit_of(config, "d", ("a_b", "c")).requests_per_unit == 2


def test_empty_and_null_descriptor_lists() -> None:
    config = load_files(
        [("a.yaml", "domain: a\ndescriptors: []\n"), ("b.yaml", "domain: b\ndescriptors:\n"),
         ("c.yaml", "domain: c\n")]
    )
    assert set(config.domains) == {"a", "b", "c"}
    assert match(config.domains["a"], [("k", "v")]) is None


def test_metadata_keys_are_not_validated() -> None:
    text = (
        "domain: d\ndescriptors:\n  - key: k\n    metadata:\n      team: payments\n"
        "      anything_goes: {nested: [1, 2]}\n"
        "    rate_limit: {unit: second, requests_per_unit: 1}\n"
    )
    config = load_files([("m.yaml", text)])
    path = match(config.domains["d"], [("k", "v")])
    assert path is not None
    assert path[-1].metadata == {"team": "payments", "anything_goes": {"nested": [1, 2]}}


def test_node_flags_are_loaded() -> None:
    text = (
        "domain: d\ndescriptors:\n  - key: k\n    shadow_mode: true\n    quota_mode: true\n"
        "    rate_limit: {unit: second, requests_per_unit: 1, name: n1}\n"
    )
    lim = limit_of(load_files([("f.yaml", text)]), "d", ("k", "x"))
    assert (lim.shadow_mode, lim.quota_mode, lim.name) == (True, True, "n1")


# --- scalar typing: the reference decodes with gopkg.in/yaml.v2 ------------------------------

@pytest.mark.parametrize(
    "raw",
    ["007", "0x1F", "1_000", "1:30", "yes", "Off", "True", "2024-01-01"],
)
def test_scalar_values_are_kept_verbatim(raw: str) -> None:
    """yaml.v2 (the reference's decoder) fills a Go string field with the scalar's source text.

    The generic key pass sees an int/bool/timestamp-string leaf (all accepted), then the typed
    pass stores the plain text, so `value: 007` matches the request value "007", `value: yes`
    matches "yes", `value: 2024-01-01` matches "2024-01-01". (Not in the §1.3 table; this is
    how the decoder named in §1.3 behaves.)
    """
    text = (
        f"domain: d\ndescriptors:\n  - key: k\n    value: {raw}\n"
        "    rate_limit: {unit: second, requests_per_unit: 3}\n"
    )
    config = load_files([("s.yaml", text)])
    path = match(config.domains["d"], [("k", raw)])
    assert path is not None, f"value: {raw} should match request value {raw!r}"
    assert path[-1].limits[0].full_key == f"d.k_{raw}"


def test_exponent_number_is_a_float_leaf() -> None:
    """yaml.v2 resolves `1e3` as a float (its float syntax needs no dot), so the generic key
    pass rejects it like `1.5`."""
    text = (
        "domain: d\ndescriptors:\n  - key: k\n    value: 1e3\n"
        "    rate_limit: {unit: second, requests_per_unit: 3}\n"
    )
    assert text_error(text) == "inline.yaml: error checking config"


# --- domains, files, merge ------------------------------------------------------------------

def test_duplicate_domain_across_files_reported_on_later_file() -> None:
    one, two = MERGE / "one.yaml", MERGE / "two.yaml"
    assert load_error([one, two]) == f"{two}: duplicate domain 'shared' in config file"


def test_duplicate_domain_accepted_with_merge() -> None:
    config = load_paths([str(MERGE / "one.yaml"), str(MERGE / "two.yaml")], merge_domains=True)
    assert set(config.domains) == {"shared"}
    assert limit_of(config, "shared", ("key1", "value1")).requests_per_unit == 1
    assert limit_of(config, "shared", ("key2", "x")).requests_per_unit == 2


def test_duplicate_node_across_merged_files() -> None:
    one, dup = MERGE / "one.yaml", MERGE / "three_dup.yaml"
    assert load_error([one, dup], merge_domains=True) == (
        f"{dup}: duplicate descriptor composite key 'shared.key1_value1'"
    )


def test_load_files_uses_given_names() -> None:
    a = "domain: same\n"
    with pytest.raises(ConfigError) as info:
        load_files([("config.a.yaml", a), ("config.b.yaml", a)])
    assert str(info.value) == "config.b.yaml: duplicate domain 'same' in config file"


def test_directory_loads_recursively_and_skips_hidden_entries() -> None:
    config = load_paths([str(GOOD)])
    assert set(config.domains) == {"alpha", "beta", "gamma"}
    # the hidden "..2024_01/alpha.yaml" (99/minute) was not read
    assert limit_of(config, "alpha", ("user", "u")).requests_per_unit == 10
    assert limit_of(config, "beta", ("ip", "10.0.0.1")).requests_per_unit == 100
    assert limit_of(config, "gamma", ("app", "a")).unit is Unit.DAY


def test_kubernetes_configmap_layout(tmp_path: Path) -> None:
    mount = tmp_path / "mount"
    real = mount / "..2024_01_01_00_00_00.000000001"
    real.mkdir(parents=True)
    shutil.copy(GOOD / "alpha.yaml", real / "alpha.yaml")
    os.symlink(real.name, mount / "..data")
    os.symlink("..data/alpha.yaml", mount / "alpha.yaml")
    config = load_paths([str(mount)])  # read once, through the visible symlink
    assert set(config.domains) == {"alpha"}
    assert config.files == (str(mount / "alpha.yaml"),)


def test_bad_file_in_directory_is_named(tmp_path: Path) -> None:
    shutil.copytree(GOOD, tmp_path / "cfg", symlinks=True)
    shutil.copy(BAD / "bad_limit_unit.yaml", tmp_path / "cfg" / "zz.yaml")
    assert load_error([tmp_path / "cfg"]) == (
        f"{tmp_path / 'cfg' / 'zz.yaml'}: invalid rate limit unit 'foo'"
    )


def rule(config, domain: str, *entries: tuple[str, str]) -> tuple[int, Unit, str]:
    found = limit_of(config, domain, *entries)
    return found.requests_per_unit, found.unit, found.name


def test_reference_fixtures_load_every_limit_they_declare() -> None:
    basic = load_paths([str(FIXTURES / "basic_config.yaml")])
    assert set(basic.domains) == {"test-domain"}
    sub = (("key1", "value1"),)
    assert rule(basic, "test-domain", *sub, ("subkey1", "other")) == (5, Unit.SECOND, "")
    assert rule(basic, "test-domain", *sub, ("subkey1", "subvalue1")) == (10, Unit.SECOND, "")
    assert match(basic.domains["test-domain"], list(sub)) is None  # a container: no limit
    assert rule(basic, "test-domain", ("key2", "any")) == (20, Unit.MINUTE, "")
    assert rule(basic, "test-domain", ("key2", "value2")) == (30, Unit.MINUTE, "")
    assert rule(basic, "test-domain", ("key4", "x")) == (1, Unit.DAY, "key4_rate_limit")
    assert rule(basic, "test-domain", ("key5", "value5")) == (15, Unit.DAY, "")
    assert rule(basic, "test-domain", ("key5", "value5"), ("subkey5", "subvalue5")) == (
        25, Unit.DAY, "")
    assert limit_of(basic, "test-domain", ("key6", "x")).unlimited
    key7 = match(basic.domains["test-domain"], [("key7", "x")])
    assert key7 is not None and key7[-1].detailed_metric

    wildcard = load_paths([str(FIXTURES / "wildcard.yaml")])
    assert rule(wildcard, "test-domain", ("wild", "foobar"))[0] == 20
    assert rule(wildcard, "test-domain", ("noWild", "foo"))[0] == 21
    assert match(wildcard.domains["test-domain"], [("noWild", "foobar")]) is None
    assert rule(wildcard, "test-domain", ("midWild", "barxyzb"))[0] == 23
    assert rule(wildcard, "test-domain", ("file", "test1"))[0] == 50  # explicit beats wildcard
    assert rule(wildcard, "test-domain", ("file", "test2"))[0] == 100

    metric = load_paths([str(FIXTURES / "value_to_metric.yaml")])
    entries = [("route", "r"), ("http_method", "GET"), ("subject_id", "s")]
    path = match(metric.domains["domain"], entries)
    assert path is not None
    assert [node.value_to_metric for node in path] == [True, True, False]
    assert rule(metric, "domain", *entries) == (60, Unit.MINUTE, "")


# --- DESIGN §5 extensions -------------------------------------------------------------------

@pytest.mark.parametrize(
    ("fixture", "needle"),
    [
        ("bad_algorithm.yaml", "magic_bucket"),
        ("zero_unit_multiplier.yaml", "unit_multiplier"),
        ("bad_timezone.yaml", "Mars/Olympus_Mons"),
        ("bad_charge.yaml", "sometimes"),
    ],
)
def test_extension_values_are_validated(fixture: str, needle: str) -> None:
    path = BAD / fixture
    err = load_error([path])
    assert err.startswith(f"{path}: ")
    assert needle in err


def test_negative_unit_multiplier_rejected() -> None:
    text = (
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n"
        "      unit_multiplier: -1\n"
    )
    assert text_error(text).startswith("inline.yaml: ")


@pytest.mark.parametrize(
    "algorithm",
    ["fixed_window", "sliding_window", "sliding_log", "token_bucket", "leaky_bucket", "gcra",
     "concurrency"],
)
def test_known_algorithms_accepted(algorithm: str) -> None:
    lim = one_limit(
        f"      unit: second\n      requests_per_unit: 5\n      algorithm: {algorithm}\n"
    )
    assert lim.algorithm == algorithm


def test_default_algorithm_is_fixed_window() -> None:
    assert one_limit("      unit: second\n").algorithm == "fixed_window"


def test_valid_extension_values() -> None:
    # each extension on its own, used the way DESIGN §5 describes it
    lim = one_limit("      unit: minute\n      requests_per_unit: 5\n      unit_multiplier: 5\n")
    assert (lim.unit_multiplier, lim.window_seconds) == (5, 300)
    lim = one_limit(
        "      unit: second\n      requests_per_unit: 5\n      algorithm: token_bucket\n"
        "      burst: 8\n"
    )
    assert (lim.algorithm, lim.burst) == ("token_bucket", 8)
    lim = one_limit("      unit: hour\n      requests_per_unit: 1000\n      overdraft: 300\n")
    assert lim.overdraft == 300
    lim = one_limit(
        "      unit: day\n      requests_per_unit: 5\n      calendar: true\n"
        "      timezone: Asia/Shanghai\n"
    )
    assert (lim.calendar, lim.timezone) == (True, "Asia/Shanghai")
    assert one_limit("      unit: second\n      charge: always\n").charge_always
    assert not one_limit("      unit: second\n      charge: on_allow\n").charge_always
    assert not one_limit("      unit: second\n").charge_always


def test_rate_limits_list_puts_several_limits_on_one_node() -> None:
    text = (
        "domain: d\ndescriptors:\n  - key: app\n    rate_limits:\n"
        "      - {unit: second, requests_per_unit: 10}\n"
        "      - {unit: day, requests_per_unit: 10000}\n"
    )
    config = load_files([("rl.yaml", text)])
    path = match(config.domains["d"], [("app", "42")])
    assert path is not None
    limits = path[-1].limits
    assert [(lim.unit, lim.requests_per_unit) for lim in limits] == [
        (Unit.SECOND, 10), (Unit.DAY, 10000)
    ]


def test_rate_limits_list_entries_are_validated() -> None:
    text = (
        "domain: d\ndescriptors:\n  - key: app\n    rate_limits:\n"
        "      - {unit: second, requests_per_unit: 10}\n      - {unit: fortnight}\n"
    )
    assert text_error(text) == "inline.yaml: invalid rate limit unit 'fortnight'"


def test_star_in_a_key_is_literal_and_loads_without_a_warning() -> None:
    """The reference matches on the joined `key_value` string, so `key: foo*` is a wildcard
    there (request key `foobar` matches). rls matches the key exactly: the file loads without
    a warning (a control plane's push would repeat it on every push); the matcher says so
    when a request is decided differently (tests/test_key_wildcards.py)."""
    config = load_files([(
        "f.yaml",
        "domain: d\ndescriptors:\n  - key: plain\n    value: x*\n"
        "    rate_limit: {unit: minute, requests_per_unit: 1}\n"
        "  - key: foo*\n    rate_limit: {unit: minute, requests_per_unit: 1}\n",
    )])
    assert config.warnings == ()
    domain = config.domains["d"]
    assert match(domain, [("foobar", "v")]) is None
    assert match(domain, [("foo*", "v")]) is not None
