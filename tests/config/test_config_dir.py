"""Hostile config directories (issue 14 item 1, DESIGN §10): FIFOs, symlink loops, links back
to a parent, billion-laughs YAML, oversized files, files that choke the cache-file probe.

Every case must end in bounded time with either a config or one short `file: message` line;
never a hang, never an exception other than ConfigError. Loads that could hang on the old
code run in a daemon thread joined with a timeout, so a regression fails instead of blocking.
"""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

import pytest

from rls.config.errors import ConfigError
from rls.config.loader import LoadBudget, load_paths
from rls.config.model import RateLimitConfig

HANG = 20.0  # seconds after which a load is declared hung (all cases take milliseconds)


def good(domain: str) -> str:
    return (
        f"domain: {domain}\ndescriptors:\n  - key: k\n    rate_limit:\n"
        "      unit: minute\n      requests_per_unit: 5\n"
    )


def billion_laughs(levels: int = 7) -> str:
    lines = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for i in range(1, levels + 1):
        refs = ", ".join([f"*a{i - 1}"] * 10)
        lines.append(f"a{i}: &a{i} [{refs}]")
    lines.append(f"domain: d\ndescriptors: *a{levels}")
    return "\n".join(lines) + "\n"


def load_bounded(paths: list[Path], budget: LoadBudget | None = None,
                 every_file: bool = False) -> RateLimitConfig:
    """load_paths in a daemon thread: raises what it raised, fails the test if it hangs."""
    box: dict[str, object] = {}

    def run() -> None:
        try:
            box["config"] = load_paths([str(p) for p in paths], budget=budget,
                                       every_file=every_file)
        except BaseException as exc:  # handed back to the test
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(HANG)
    assert not thread.is_alive(), f"load of {paths} hung for {HANG} s"
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["config"]  # type: ignore[return-value]


def config_error(paths: list[Path], budget: LoadBudget | None = None,
                 every_file: bool = False) -> str:
    try:
        load_bounded(paths, budget, every_file)
    except ConfigError as exc:
        message = str(exc)
        assert "\n" not in message and len(message) < 400, message
        assert "Traceback" not in message
        return message
    raise AssertionError("the load did not fail")


@pytest.fixture
def cfg(tmp_path: Path) -> Path:
    d = tmp_path / "cfg"
    d.mkdir()
    (d / "a.yaml").write_text(good("alpha"))
    return d


def test_fifo_in_directory_is_skipped_with_a_warning(cfg: Path, caplog) -> None:
    os.mkfifo(cfg / "pipe.yaml")
    config = load_bounded([cfg])
    assert set(config.domains) == {"alpha"}
    assert any("pipe.yaml: skipped: not a regular file (a FIFO)" in r.message
               for r in caplog.records)


def test_fifo_named_explicitly_is_an_error_not_a_hang(cfg: Path) -> None:
    os.mkfifo(cfg / "pipe.yaml")
    assert "not a regular file" in config_error([cfg / "pipe.yaml"])


def test_symlinks_pointing_at_each_other_are_skipped(cfg: Path, caplog) -> None:
    os.symlink("y.yaml", cfg / "x.yaml")
    os.symlink("x.yaml", cfg / "y.yaml")
    os.symlink("loop2", cfg / "loop1")
    os.symlink("loop1", cfg / "loop2")
    config = load_bounded([cfg])
    assert set(config.domains) == {"alpha"}
    assert any("x.yaml: skipped" in r.message for r in caplog.records)


def test_directory_link_back_to_parent_loads_each_file_once(cfg: Path) -> None:
    sub = cfg / "sub"
    sub.mkdir()
    (sub / "b.yaml").write_text(good("beta"))
    os.symlink("..", sub / "up")  # sub/up/a.yaml would be a.yaml again
    os.symlink(".", cfg / "self")
    config = load_bounded([cfg])
    assert set(config.domains) == {"alpha", "beta"}
    assert config.files == (str(cfg / "a.yaml"), str(sub / "b.yaml"))


def test_two_links_back_to_parents_do_not_walk_forever(cfg: Path) -> None:
    for i in range(3):
        os.symlink(".", cfg / f"again{i}")
        os.symlink("..", cfg / f"up{i}")
    config = load_bounded([cfg])
    assert set(config.domains) == {"alpha"}


def test_billion_laughs_rejected_naming_file_and_line(cfg: Path) -> None:
    (cfg / "lol.yaml").write_text(billion_laughs(7))
    message = config_error([cfg])
    assert message.startswith(f"{cfg / 'lol.yaml'}: error loading config file: yaml: line ")
    assert "nodes once aliases are expanded" in message


def test_file_over_size_limit_rejected_unparsed(cfg: Path) -> None:
    (cfg / "big.yaml").write_text(good("big") + "# " + "x" * 2_000_000 + "\n")
    message = config_error([cfg])
    assert message.startswith(f"{cfg / 'big.yaml'}: ")
    assert "over the 1048576-byte limit per file" in message


def test_small_budget_applies_to_total_bytes(cfg: Path) -> None:
    (cfg / "b.yaml").write_text(good("beta"))
    budget = LoadBudget(max_total_bytes=len(good("alpha")) + 10)
    assert "config files total over" in config_error([cfg], budget)


@pytest.mark.parametrize(
    "text",
    ["[" * 2000 + "]" * 2000, "domain: !!float ;\n", "rules: !!int x\n"],
    ids=["deep-nesting", "bad-float-tag", "bad-int-tag"],
)
def test_file_that_breaks_the_cache_probe_is_a_config_error(cfg: Path, text: str) -> None:
    """Directory files are probed for cache rules; the probe used to let RecursionError and
    ValueError escape as a traceback."""
    (cfg / "bad.yaml").write_text(text)
    assert config_error([cfg]).startswith(f"{cfg / 'bad.yaml'}: error loading config file")


def test_cache_rule_files_in_directory_are_still_left_to_cache_config(cfg: Path) -> None:
    (cfg / "cache.yaml").write_text("rules:\n  - api: translate\n")
    assert set(load_bounded([cfg]).domains) == {"alpha"}


def test_kubernetes_configmap_mount_still_read_once(tmp_path: Path) -> None:
    mount = tmp_path / "mount"
    real = mount / "..2024_01_01_00_00_00.000000001"
    real.mkdir(parents=True)
    (real / "a.yaml").write_text(good("alpha"))
    os.symlink(real.name, mount / "..data")
    os.symlink("..data/a.yaml", mount / "a.yaml")
    os.symlink("a.yaml", mount / "alias.yaml")  # a second visible name for the same file
    config = load_bounded([mount])
    assert config.files == (str(mount / "a.yaml"),)
    shutil.rmtree(real)  # dangling links: skipped, not fatal
    assert load_bounded([mount]).domains == {}


def configmap(mount: Path, files: dict[str, str]) -> None:
    """A ConfigMap volume as the kubelet writes it: the keys in a timestamped directory,
    `..data` a link to it, and one visible link per key through `..data`."""
    real = mount / "..2024_01_01_00_00_00.000000001"
    real.mkdir(parents=True)
    for name, text in files.items():
        (real / name).write_text(text)
        os.symlink(f"..data/{name}", mount / name)
    os.symlink(real.name, mount / "..data")


def test_a_file_without_a_yaml_name_is_skipped_with_a_warning_naming_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    """`rls serve`'s default: only *.yaml / *.yml are read, but a ConfigMap key without an
    extension is named, not dropped silently (its domain would answer every call OK)."""
    mount = tmp_path / "mount"
    configmap(mount, {"a.yaml": good("alpha"), "partner-limits": good("partner")})
    os.mkfifo(mount / "pipe")
    assert set(load_bounded([mount]).domains) == {"alpha"}
    skipped = [r.message for r in caplog.records if "does not end in .yaml or .yml" in r.message]
    assert skipped == [f"{mount / 'partner-limits'}: skipped: its name does not end in .yaml or "
                       ".yml (envoyproxy/ratelimit reads every file of its directory: rename "
                       "it, or pass --config-all-files)"]


def test_every_file_reads_a_configmap_key_without_extension_once(tmp_path: Path) -> None:
    """As the reference's runtime loader (the `ratelimit` entry): every file, whatever its
    name; `..data` and the timestamped directory are dot entries, never read a second time."""
    mount = tmp_path / "mount"
    configmap(mount, {"a.yaml": good("alpha"), "partner-limits": good("partner"),
                      "notes.txt": good("notes")})
    config = load_bounded([mount], every_file=True)
    assert set(config.domains) == {"alpha", "notes", "partner"}
    assert config.files == tuple(str(mount / n) for n in ("a.yaml", "notes.txt",
                                                          "partner-limits"))


def test_every_file_still_skips_a_fifo_without_opening_it(cfg: Path, caplog) -> None:
    os.mkfifo(cfg / "pipe")
    assert set(load_bounded([cfg], every_file=True).domains) == {"alpha"}
    assert any("pipe: skipped: not a regular file (a FIFO)" in r.message
               for r in caplog.records)


@pytest.mark.parametrize(("name", "content", "says"), [
    ("big", (good("big") + "# " + "x" * 2_000_000 + "\n").encode(),
     "over the 1048576-byte limit per file"),
    ("blob", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "not UTF-8"),
])
def test_every_file_rejects_huge_and_binary_files_naming_them(
    cfg: Path, name: str, content: bytes, says: str,
) -> None:
    (cfg / name).write_bytes(content)
    message = config_error([cfg], every_file=True)
    assert message.startswith(f"{cfg / name}: ") and says in message, message


def test_unreadable_character_error_is_one_line(cfg: Path) -> None:
    """Found by tests/config/test_loader_fuzz.py: PyYAML's reader error spans two lines."""
    (cfg / "nul.yaml").write_text("domain: d\x00\n")
    message = config_error([cfg])
    assert message.startswith(f"{cfg / 'nul.yaml'}: error loading config file: yaml: ")
    assert "unacceptable character #x0000" in message


@pytest.mark.process
def test_check_config_on_a_hostile_directory_reports_lines_not_tracebacks(cfg: Path) -> None:
    import subprocess
    import sys

    (cfg / "deep.yaml").write_text("[" * 3000 + "]" * 3000)
    (cfg / "tag.yaml").write_text("domain: !!float ;\n")
    os.mkfifo(cfg / "fifo.yaml")
    done = subprocess.run([sys.executable, "-m", "rls", "check-config", str(cfg)],
                          capture_output=True, text=True, timeout=60)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert "Traceback" not in out, out
    assert f"{cfg / 'deep.yaml'}: error loading config file: yaml: line 1: nested deeper" in out
    assert f"{cfg / 'tag.yaml'}: error loading config file: yaml: bad scalar" in out


def test_load_time_budget_abandons_the_load(cfg: Path) -> None:
    assert "config load took longer than 0 s; load abandoned" in config_error(
        [cfg], LoadBudget(load_seconds=0.0))


def test_parse_time_budget_stops_a_slow_file_naming_its_line(cfg: Path) -> None:
    many = "".join(f"  - key: k{i}\n    rate_limit: {{unit: hour, requests_per_unit: 1}}\n"
                   for i in range(3000))
    (cfg / "many.yaml").write_text("domain: m\ndescriptors:\n" + many)
    message = config_error([cfg], LoadBudget(file_seconds=0.0))
    assert message.startswith(f"{cfg / 'many.yaml'}: error loading config file: yaml: line ")
    assert message.endswith("time budget exceeded while parsing")
