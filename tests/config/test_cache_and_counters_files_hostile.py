"""`--cache-config` and `--counters-config` files get the descriptor loader's guards.

They were read with a plain open() and yaml.safe_load: a FIFO blocked `rls serve
--counters-config` forever (SIGTERM could not stop it), `/dev/zero` or a 1 GB file was read
whole, and deep nesting or a YAML bomb was a RecursionError traceback or an unbounded
expansion. Now each is one located `file: message`, exit 1, as for descriptor files.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import free_port
from support.rls_cli import ROOT, rls

pytestmark = pytest.mark.process

BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{n}: &{n} [{', '.join([f'*{p}'] * 9)}]\n" for p, n in zip("abcdefgh", "bcdefghi", strict=True)
) + "rules: *i\n"


def hostile(tmp_path: Path, kind: str) -> Path:
    path = tmp_path / f"{kind}.yaml"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "zero":
        path.symlink_to("/dev/zero")
    elif kind == "sparse":
        with open(path, "wb") as f:
            f.truncate(64 << 20)
    elif kind == "deep":
        path.write_text("rules: " + "[" * 5000 + "]" * 5000 + "\n")
    else:
        path.write_text(BOMB)
    return path


CASES = [("fifo", "a FIFO, not a regular file"), ("zero", "a device, not a regular file"),
         ("sparse", "over the 1048576-byte limit"), ("deep", "nested deeper than"),
         ("bomb", "nodes once aliases are expanded")]


@pytest.mark.parametrize("flag", ["--cache-config", "--counters-config"])
@pytest.mark.parametrize(("kind", "says"), CASES, ids=[k for k, _ in CASES])
def test_check_config_refuses_a_hostile_file_in_one_line(
    tmp_path: Path, flag: str, kind: str, says: str
) -> None:
    path = hostile(tmp_path, kind)
    done = rls("check-config", flag, str(path), timeout=30)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert says in done.stderr and str(path) in done.stderr


@pytest.mark.parametrize(("kind", "says"), [CASES[0], CASES[3]], ids=["fifo", "deep"])
def test_serve_with_a_hostile_counters_config_exits_1_with_one_line(
    tmp_path: Path, kind: str, says: str
) -> None:
    path = hostile(tmp_path, kind)
    done = rls("serve", "--config", str(ROOT / "config"), "--counters-config", str(path),
               "--grpc-addr", f"127.0.0.1:{free_port()}",
               "--http-addr", f"127.0.0.1:{free_port()}", timeout=30)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    last = [line for line in done.stderr.splitlines() if line.strip()][-1]
    assert last.startswith(f"rls: {path}: ") and says in last


def test_serve_with_a_fifo_as_cache_config_says_not_a_regular_file(tmp_path: Path) -> None:
    """It said "no such file" of a path `ls` lists."""
    path = hostile(tmp_path, "fifo")
    done = rls("serve", "--config", str(ROOT / "config"), "--cache-config", str(path),
               "--grpc-addr", f"127.0.0.1:{free_port()}",
               "--http-addr", f"127.0.0.1:{free_port()}", timeout=30)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == f"rls: --cache-config: {path}: not a regular file"
