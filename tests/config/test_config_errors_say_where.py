"""Issue 18 item 2: config errors keep the reference's text and say where.

`str(error)` stays `file: message` (the reference's text, compared by the compatibility tests);
`detail()` — what check-config, reload logs and startup print — adds `at file:line`, the node
path `domain.key_value.key` and a "did you mean" for misspelled keys. Things that load but are
probably mistakes are warnings, errors with --strict: a key repeated in one YAML mapping, a
rate_limit without requests_per_unit, a directory without descriptor files.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import wait_until
from support.rls_cli import rls

from rls.config.errors import ConfigError
from rls.config.loader import load_files


def error_of(text: str, name: str = "f.yaml") -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_files([(name, text)])
    return info.value


def test_misspelled_key_has_line_node_path_and_did_you_mean() -> None:
    exc = error_of(
        "domain: d\n"
        "descriptors:\n"
        "  - key: user\n"
        "    value: alice\n"
        "    rate_limit:\n"
        "      unit: minute\n"
        "      requests_per_unti: 10\n"
    )
    assert str(exc) == "f.yaml: config error, unknown key 'requests_per_unti'"
    assert exc.detail() == (
        "f.yaml: config error, unknown key 'requests_per_unti' (at f.yaml:7, node "
        "d.user_alice.rate_limit.requests_per_unti; did you mean 'requests_per_unit'?)"
    )


def test_reference_misspelling_ratelimit_suggests_rate_limit() -> None:
    exc = error_of("domain: d\ndescriptors:\n  - key: k\n    ratelimit: {unit: second}\n")
    assert exc.message == "config error, unknown key 'ratelimit'"
    assert exc.line == 4 and exc.node == "d.k.ratelimit"
    assert exc.hint == "did you mean 'rate_limit'?"


def test_float_leaf_says_which_field_and_line() -> None:
    exc = error_of(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n"
        "      unit: second\n      requests_per_unit: 2.5\n"
    )
    assert exc.message == "error checking config"
    assert (exc.line, exc.node) == (6, "d.k.rate_limit.requests_per_unit")
    assert "2.5" in exc.detail()


def test_empty_key_points_at_the_node() -> None:
    exc = error_of("domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - value: x\n")
    assert exc.message == "descriptor has empty key"
    assert exc.line == 5 and exc.node is not None and exc.node.startswith("d.a.")


def test_typed_error_points_at_the_field_line() -> None:
    exc = error_of(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n"
        "      unit: second\n      requests_per_unit: abc\n"
    )
    assert exc.message.startswith("error loading config file: yaml: unmarshal errors:")
    assert (exc.line, exc.node) == (6, "d.k.rate_limit")


def test_bad_unit_in_nested_node() -> None:
    exc = error_of(
        "domain: d\ndescriptors:\n  - key: a\n    value: b\n    descriptors:\n"
        "      - key: c\n        rate_limit:\n          unit: fortnight\n"
    )
    assert str(exc) == "f.yaml: invalid rate limit unit 'fortnight'"
    assert (exc.line, exc.node) == (8, "d.a_b.c.rate_limit")


def test_duplicate_yaml_key_and_missing_requests_per_unit_are_warnings() -> None:
    config = load_files([(
        "f.yaml",
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n"
        "      unit: second\n      unit: minute\n",
    )])
    texts = [str(w) for w in config.warnings]
    assert any("key 'unit' appears twice" in t and "at f.yaml:6" in t for t in texts), texts
    assert any("rate_limit without requests_per_unit" in t and "node d.k.rate_limit" in t
               for t in texts), texts


def test_yaml_merge_key_override_is_not_a_duplicate() -> None:
    config = load_files([(
        "f.yaml",
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n"
        "      <<: {unit: second, requests_per_unit: 1}\n      requests_per_unit: 2\n",
    )])
    assert config.warnings == ()


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.mark.process
def test_check_config_prints_warnings_and_fails_only_with_strict(tmp_path: Path) -> None:
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    dup = write(cfg / "dup.yaml", "domain: d\ndomain: e\n")
    (tmp_path / "empty").mkdir()
    done = rls("check-config", str(cfg), str(tmp_path / "empty"))
    assert done.returncode == 0, done.stderr
    assert f"{dup}: warning: key 'domain' appears twice" in done.stderr
    assert f"{tmp_path / 'empty'}: warning: directory has no descriptor files" in done.stderr
    assert "2 warning(s)" in done.stdout
    strict = rls("check-config", "--strict", str(cfg), str(tmp_path / "empty"))
    assert strict.returncode == 1
    assert "FAILED (--strict)" in strict.stderr


@pytest.mark.process
def test_check_config_prints_location_after_reference_text(tmp_path: Path) -> None:
    bad = write(tmp_path / "bad.yaml",
                "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second}\n"
                "    shadow_mod: true\n")
    done = rls("check-config", str(bad))
    assert done.returncode == 1
    assert done.stderr.strip() == (
        f"{bad}: config error, unknown key 'shadow_mod' "
        f"(at {bad}:5, node d.k.shadow_mod; did you mean 'shadow_mode'?)"
    )


def test_empty_file_says_it_is_empty() -> None:
    exc = error_of("")
    assert str(exc) == "f.yaml: config file cannot have empty domain"
    assert exc.detail() == (
        "f.yaml: config file cannot have empty domain (at f.yaml:1; the file is empty)"
    )


def test_reload_log_names_the_changed_file_the_line_and_keeps_the_old_config(
    rls_factory, tmp_path: Path
) -> None:
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    good = write(cfg / "a.yaml", "domain: a\ndescriptors:\n  - key: k\n"
                 "    rate_limit: {unit: minute, requests_per_unit: 3}\n")
    proc = rls_factory(cfg, args=("--reload-interval", "0.2"))
    good.write_text("domain: a\ndescriptors:\n  - key: k\n    rate_limit:\n"
                    "      unit: minute\n      requests_per_unit: 3\n      burts: 2\n")
    expected = (
        f"error loading new configuration: {good}: config error, unknown key 'burts' "
        f"(at {good}:7, node a.k.rate_limit.burts; did you mean 'burst'?); "
        "keeping previous config"
    )
    wait_until(lambda: expected in proc.log(), timeout=10, what="reload error logged")
    assert f"config change detected: {good}" in proc.log()


MISINDENTED = (
    "domain: d\n"
    "descriptors:\n"
    "  - key: k\n"
    "    rate_limit:\n"
    "    unit: second\n"
    "    requests_per_unit: 1\n"
)


def test_limit_fields_beside_an_empty_rate_limit_are_located_warnings() -> None:
    texts = [str(w) for w in load_files([("f.yaml", MISINDENTED)]).warnings]
    assert any("'unit' is a rate limit field on the descriptor itself" in t
               and "at f.yaml:5, node d.k.unit" in t for t in texts), texts
    assert any("'requests_per_unit' is a rate limit field" in t and "at f.yaml:6" in t
               for t in texts), texts
    assert any("empty rate_limit" in t and "at f.yaml:4, node d.k.rate_limit" in t
               for t in texts), texts


def test_limit_field_beside_a_full_rate_limit_and_at_the_top_are_warnings() -> None:
    config = load_files([(
        "f.yaml",
        "domain: d\nalgorithm: gcra\ndescriptors:\n  - key: k\n"
        "    rate_limit: {unit: second, requests_per_unit: 1}\n    burst: 5\n",
    )])
    texts = [str(w) for w in config.warnings]
    assert any("'algorithm' at the top of the file is ignored" in t and "at f.yaml:2" in t
               for t in texts), texts
    assert any("'burst' is a rate limit field" in t and "node d.k.burst" in t
               for t in texts), texts


@pytest.mark.process
def test_check_config_strict_fails_on_a_misindented_limit(tmp_path: Path) -> None:
    bad = write(tmp_path / "bad.yaml", MISINDENTED)
    done = rls("check-config", str(bad))
    assert done.returncode == 0, done.stderr
    assert f"{bad}: warning: 'unit' is a rate limit field" in done.stderr
    assert f"at {bad}:5" in done.stderr
    strict = rls("check-config", "--strict", str(bad))
    assert strict.returncode == 1
    assert "FAILED (--strict): 3 warning(s)" in strict.stderr
