"""A running `rls serve` fed hostile config changes (issue 14 item 1): the previous config keeps
serving, the error gauge and counter are set, the log holds one short line and no traceback;
at start-up the same bad directory makes `rls serve` exit 1 with one clear line. Watching is
inotify-driven: an idle watcher never stats the files, and loads run off the event loop.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from conftest import ROOT, http_get, wait_until
from support.metrics import metric

from rls.config import reload as reload_mod
from rls.config.reload import ConfigHolder
from rls.observability.metrics import Metrics

from .test_config_dir import billion_laughs, good


def rlconfig(url: str) -> str:
    return http_get(url + "/rlconfig")[1].decode()


@pytest.mark.process
def test_bad_directory_at_startup_exits_1_with_one_line(tmp_path: Path) -> None:
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    (cfg / "a.yaml").write_text(good("alpha"))
    (cfg / "deep.yaml").write_text("[" * 3000 + "]" * 3000)
    os.mkfifo(cfg / "fifo.yaml")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLS_")}
    proc = subprocess.run(
        [sys.executable, "-m", "rls", "serve", "--config", str(cfg),
         "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"],
        capture_output=True, text=True, timeout=60, env=env, cwd=str(ROOT),
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "Traceback" not in out, out
    lines = [line for line in out.splitlines() if "cannot start" in line]
    assert len(lines) == 1, out
    assert f"{cfg / 'deep.yaml'}: error loading config file: yaml: line 1:" in lines[0]


def test_running_rls_keeps_config_through_hostile_files(rls_factory, tmp_path: Path) -> None:
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    (cfg / "a.yaml").write_text(good("alpha"))
    rls = rls_factory(cfg)
    url = rls.http_url
    assert "alpha.k:" in rlconfig(url)
    errors = metric(url, "rls_config_loads_total", result="error")

    os.mkfifo(cfg / "fifo.yaml")
    os.symlink("loop.yaml", cfg / "loop.yaml")
    (cfg / "lol.yaml").write_text(billion_laughs(7))
    lol = str(cfg / "lol.yaml")
    wait_until(lambda: metric(url, "rls_config_last_load_error", file=lol) == 1, 10,
               "billion-laughs file counted as a failed load")
    assert metric(url, "rls_config_loads_total", result="error") > errors
    assert "alpha.k:" in rlconfig(url)
    assert http_get(url + "/healthcheck")[0] == 200
    log = rls.log()
    assert "Traceback" not in log
    assert max(len(line) for line in log.splitlines()) < 600

    (cfg / "lol.yaml").unlink()
    (cfg / "b.yaml").write_text(good("beta"))
    wait_until(lambda: "beta.k:" in rlconfig(url), 10, "fixed directory loaded")
    assert metric(url, "rls_config_last_load_error", file=lol) == 0
    assert "fifo.yaml: skipped: not a regular file (a FIFO)" in rls.log()


async def test_idle_watch_stats_nothing_and_loads_off_the_loop(tmp_path: Path,
                                                               monkeypatch) -> None:
    """No per-file polling: with nothing changing, the watcher lists and stats the config
    files once (when its watches are in place), then never; a change is loaded in a thread
    other than the event loop's."""
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    for i in range(2000):
        (cfg / f"f{i:04}.yaml").write_text(good(f"d{i}"))
    holder = ConfigHolder([str(cfg)], Metrics())
    assert holder.reload()
    loop_thread = threading.get_ident()
    calls: list[int] = []
    real = reload_mod.config_files

    def counting(paths: list[str], every_file: bool = False) -> list[str]:
        calls.append(threading.get_ident())
        return real(paths, every_file)

    monkeypatch.setattr(reload_mod, "config_files", counting)
    holder.start(0.05)
    await asyncio.sleep(0.6)  # one check once the watches are in place (changes before that)
    settled = len(calls)
    assert settled <= 1
    await asyncio.sleep(1.0)  # twenty poll intervals of the old design
    assert len(calls) == settled
    (cfg / "f0000.yaml").write_text(good("changed"))
    for _ in range(200):
        if "changed" in holder.current().domains:
            break
        await asyncio.sleep(0.05)
    await holder.stop()
    assert "changed" in holder.current().domains
    assert calls and loop_thread not in calls
