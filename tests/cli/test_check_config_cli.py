"""`rls check-config PATH...` (DESIGN §4): `file: message` per error on stderr, exit 1 on any."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.process

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "config"
GOOD = FIXTURES / "good"
BAD = FIXTURES / "bad"
MERGE = FIXTURES / "merge"


def check_config(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rls", "check-config", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def messages(stderr: str) -> list[str]:
    """stderr lines without the location suffix `(at file:line, node …)`: the reference text."""
    return [re.sub(r" \(at [^()]*\)$", "", line) for line in stderr.splitlines()]


def good_copy(tmp_path: Path) -> Path:
    target = tmp_path / "cfg"
    shutil.copytree(GOOD, target, symlinks=True)
    return target


def test_good_directory_exits_0(tmp_path: Path) -> None:
    result = check_config(good_copy(tmp_path))
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert result.stdout.startswith("OK")


def test_good_files_and_directories_mixed() -> None:
    result = check_config(GOOD / "alpha.yaml", FIXTURES / "basic_config.yaml", GOOD / "sub")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("OK")


def test_one_bad_file_among_good_ones(tmp_path: Path) -> None:
    cfg = good_copy(tmp_path)
    bad = cfg / "broken.yaml"
    shutil.copy(BAD / "empty_key.yaml", bad)
    result = check_config(cfg)
    assert result.returncode == 1
    assert f"{bad}: descriptor has empty key" in messages(result.stderr)
    assert "OK" not in result.stdout


def test_two_bad_files_are_both_reported(tmp_path: Path) -> None:
    cfg = good_copy(tmp_path)
    bad1, bad2 = cfg / "a_unit.yaml", cfg / "sub" / "z_key.yaml"
    shutil.copy(BAD / "bad_limit_unit.yaml", bad1)
    shutil.copy(BAD / "misspelled_key.yaml", bad2)
    result = check_config(cfg)
    assert result.returncode == 1
    lines = messages(result.stderr)
    assert f"{bad1}: invalid rate limit unit 'foo'" in lines
    assert f"{bad2}: config error, unknown key 'ratelimit'" in lines


def test_bad_files_given_as_files() -> None:
    yaml_err, dup = BAD / "bad_yaml.yaml", BAD / "duplicate_key.yaml"
    result = check_config(GOOD / "alpha.yaml", yaml_err, dup)
    assert result.returncode == 1
    lines = messages(result.stderr)
    assert any(line.startswith(f"{yaml_err}: error loading config file:") for line in lines)
    assert f"{dup}: duplicate descriptor composite key 'test-domain.key1_value1'" in lines


def test_duplicate_domain_across_files() -> None:
    one, two = MERGE / "one.yaml", MERGE / "two.yaml"
    result = check_config(one, two)
    assert result.returncode == 1
    assert f"{two}: duplicate domain 'shared' in config file" in messages(result.stderr)


def test_merge_domains_flag() -> None:
    result = check_config("--merge-domains", MERGE / "one.yaml", MERGE / "two.yaml")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("OK")
    dup = MERGE / "three_dup.yaml"
    result = check_config("--merge-domains", MERGE / "one.yaml", dup)
    assert result.returncode == 1
    assert (
        f"{dup}: duplicate descriptor composite key 'shared.key1_value1'"
        in messages(result.stderr)
    )


def test_missing_path_fails(tmp_path: Path) -> None:
    result = check_config(tmp_path / "does-not-exist.yaml")
    assert result.returncode == 1
    assert str(tmp_path / "does-not-exist.yaml") in result.stderr


def test_config_flag_works_like_serve_s(tmp_path: Path) -> None:
    """`rls check-config --config PATH`, as a user of `rls serve --config PATH` types it."""
    good = check_config("--config", good_copy(tmp_path))
    assert good.returncode == 0, good.stderr
    bad = check_config("--config", BAD)
    assert bad.returncode == 1 and bad.stderr
    nothing = check_config()
    assert nothing.returncode == 2 and "--config PATH" in nothing.stderr


def test_config_all_files_checks_what_bin_ratelimit_reads(tmp_path: Path) -> None:
    """A file without .yaml/.yml is named and left out by default (as `rls serve` does), and
    checked with --config-all-files (as `rls serve --config-all-files` and /bin/ratelimit
    read it)."""
    cfg = good_copy(tmp_path)
    (cfg / "partner-limits").write_text("domain: partner\ndescriptors:\n  - value: x\n")
    default = check_config(cfg)
    assert default.returncode == 0, default.stderr
    assert f"{cfg / 'partner-limits'}: skipped: its name does not end in .yaml" in default.stderr
    every = check_config("--config-all-files", cfg)
    assert every.returncode == 1, every.stderr
    assert f"{cfg / 'partner-limits'}: descriptor has empty key" in messages(every.stderr)
