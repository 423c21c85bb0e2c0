"""A skipped entry of a config directory (FIFO, device link, link loop) is reported once.

`rls check-config` walked the directory three times (empty-directory check, descriptor
discovery, cache rules discovery) and `rls serve` twice at start, each walk logging every skip
again, so one FIFO showed up as three identical lines.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from conftest import free_port
from support.rls_cli import ROOT, rls

pytestmark = pytest.mark.process


def hostile_dir(tmp_path: Path) -> Path:
    target = tmp_path / "cfg"
    target.mkdir()
    shutil.copy(ROOT / "config" / "example.yaml", target / "example.yaml")
    os.mkfifo(target / "fifo.yaml")
    (target / "zero.yaml").symlink_to("/dev/zero")
    (target / "loop.yaml").symlink_to("loop.yaml")
    return target


def skip_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "skipped:" in line]


def test_check_config_reports_each_skipped_entry_once(tmp_path: Path) -> None:
    cfg = hostile_dir(tmp_path)
    done = rls("check-config", str(cfg), timeout=60)
    assert done.returncode == 0, done.stderr
    lines = skip_lines(done.stderr)
    assert len(lines) == 3, done.stderr
    assert {line.split(": skipped:")[0].split()[-1] for line in lines} == {
        str(cfg / "fifo.yaml"), str(cfg / "zero.yaml"), str(cfg / "loop.yaml")}


def test_serve_logs_each_skipped_entry_once_at_start(tmp_path: Path) -> None:
    cfg = hostile_dir(tmp_path)
    (cfg / "example.yaml").write_text("domain: x\ndescriptors:\n  - key: k\n    rate_limit: "
                                      "{unit: fortnight, requests_per_unit: 1}\n")
    done = rls("serve", "--config", str(cfg), "--grpc-addr", f"127.0.0.1:{free_port()}",
               "--http-addr", f"127.0.0.1:{free_port()}", timeout=60)
    assert done.returncode == 1, done.stderr  # the bad file stops start-up after the walk
    assert len(skip_lines(done.stderr)) == 3, done.stderr


def test_cache_file_named_and_inside_a_directory_is_checked_once() -> None:
    """`check-config config/ --cache-config config/cache.yaml` said 3 cache rules files."""
    done = rls("check-config", "config/", "--cache-config", "config/cache.yaml", timeout=60)
    assert done.returncode == 0, done.stderr
    cache_files = len(list((ROOT / "config").glob("cache*.yaml")))
    assert f"{cache_files} cache rules file(s)" in done.stdout, done.stdout
