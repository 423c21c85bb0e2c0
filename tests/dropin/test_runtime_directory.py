"""The reference's FILE-mode variables locate and watch the config directory under
`/bin/ratelimit`: RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY is read, dot files and
dot directories are not, an edit inside it is live within the reload contract, and in
RUNTIME_WATCH_ROOT=true's layout (RUNTIME_ROOT a symlink to one version of the tree) moving
the link to a new version is too."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from envoy.service.ratelimit.v3 import rls_pb2
from support.net import free_port
from support.waiting import wait_until

from .helpers import Ratelimit, config_text, decide, write

pytestmark = pytest.mark.process

RELOAD_TIMEOUT = 5.0  # the contract is 2 s; slack for a loaded machine


def runtime_env(root: str, subdirectory: str, watch_root: bool, **extra: str) -> dict[str, str]:
    return {"RUNTIME_ROOT": root, "RUNTIME_SUBDIRECTORY": subdirectory,
            "RUNTIME_IGNOREDOTFILES": "true", "RUNTIME_WATCH_ROOT": str(watch_root).lower(),
            "GRPC_HOST": "127.0.0.1", "GRPC_PORT": str(free_port()),
            "HOST": "127.0.0.1", "PORT": str(free_port()), **extra}


def rlconfig(rl: Ratelimit) -> str:
    status, text = rl.http("/rlconfig")
    assert status == 200, text
    return text


def test_runtime_variables_locate_the_directory_skip_dot_files_and_reload_edits(
    root: Path, launch: Callable[..., Ratelimit],
) -> None:
    srv = root / "srv"
    write(srv / "rl/limits/a.yaml", config_text("a", "k", 1))
    write(srv / "rl/limits/nested/b.yaml", config_text("b", "k", 2))
    write(srv / "rl/outside.yaml", config_text("outside", "k", 3))  # not in the app directory
    write(srv / "rl/limits/.hidden.yaml", config_text("hidden", "k", 4))
    write(srv / "rl/limits/.dotdir/c.yaml", config_text("dotdir", "k", 5))
    rl = launch(runtime_env(str(srv), "rl", False, RUNTIME_APPDIRECTORY="limits"))

    dump = rlconfig(rl)
    assert "a.k: unit=MINUTE requests_per_unit=1" in dump
    assert "b.k: unit=MINUTE requests_per_unit=2" in dump
    for absent in ("outside.", "hidden.", "dotdir."):
        assert absent not in dump, dump

    with open(srv / "rl/limits/a.yaml", "w") as f:  # an edit in place
        f.write(config_text("a", "k", 9))
    wait_until(lambda: "a.k: unit=MINUTE requests_per_unit=9" in rlconfig(rl),
               timeout=RELOAD_TIMEOUT, what="the edit live", log=rl.log)
    write(srv / "rl/limits/.hidden.yaml", config_text("hidden", "k", 6))
    write(srv / "rl/limits/d.yaml", config_text("d", "k", 7))
    wait_until(lambda: "d.k:" in rlconfig(rl), timeout=RELOAD_TIMEOUT, what="a new file",
               log=rl.log)
    assert "hidden." not in rlconfig(rl)


def test_watch_root_layout_reloads_when_the_runtime_root_link_moves(
    root: Path, launch: Callable[..., Ratelimit],
) -> None:
    """/srv/runtime_data/current -> v1, then -> v2 (an atomic rename of a new link, as
    deploy tools do): the files under the old target never change, only the link does."""
    runtime = root / "runtime"
    write(runtime / "v1/ratelimit/config/a.yaml", config_text("a", "k", 1))
    write(runtime / "v2/ratelimit/config/a.yaml", config_text("a", "k", 2))
    os.symlink("v1", runtime / "current")
    rl = launch(runtime_env(str(runtime / "current"), "ratelimit", True))
    assert "a.k: unit=MINUTE requests_per_unit=1" in rlconfig(rl)
    # rls reloads an edit too (the reference's RUNTIME_WATCH_ROOT=true would not); once it is
    # live the watches are certainly in place, so the swap below is seen by them alone.
    write(runtime / "v1/ratelimit/config/a.yaml", config_text("a", "k", 3))
    wait_until(lambda: "a.k: unit=MINUTE requests_per_unit=3" in rlconfig(rl),
               timeout=RELOAD_TIMEOUT, what="the edit live", log=rl.log)

    os.symlink("v2", runtime / "next")
    os.replace(runtime / "next", runtime / "current")
    wait_until(lambda: "a.k: unit=MINUTE requests_per_unit=2" in rlconfig(rl),
               timeout=RELOAD_TIMEOUT, what="the new version live", log=rl.log)


def test_a_configmap_key_without_extension_is_read_once_as_the_reference_reads_it(
    root: Path, launch: Callable[..., Ratelimit],
) -> None:
    """The reference's runtime loader reads every file of the directory, whatever its name:
    a ConfigMap key `partner-limits` holds a domain there, so it must here too (skipped, its
    domain would be unknown and every call OK). The kubelet's `..data` and timestamped
    directory are dot entries: each key is read once, through its visible link."""
    app = root / "srv/rl/config"
    real = app / "..2024_01_01_00_00_00.000000001"
    write(real / "partner-limits", config_text("partner", "client", 1))
    write(real / "a.yaml", config_text("a", "k", 2))
    os.symlink(real.name, app / "..data")
    for name in ("partner-limits", "a.yaml"):
        os.symlink(f"..data/{name}", app / name)
    rl = launch(runtime_env(str(root / "srv"), "rl", False))

    dump = rlconfig(rl)
    assert [line for line in dump.splitlines() if line.startswith("partner.client:")] == [
        "partner.client: unit=MINUTE requests_per_unit=1, shadow_mode: false, quota_mode: false"]
    assert "a.k: unit=MINUTE requests_per_unit=2" in dump
    assert "skipped" not in rl.log()
    channel = grpc.insecure_channel(f"127.0.0.1:{rl.ports.grpc}")
    assert decide(channel, "partner", "client", "acme") == rls_pb2.RateLimitResponse.OK
    assert decide(channel, "partner", "client", "acme") == rls_pb2.RateLimitResponse.OVER_LIMIT

    write(real / "partner-limits", config_text("partner", "client", 9))  # an edit of the key
    wait_until(lambda: "partner.client: unit=MINUTE requests_per_unit=9" in rlconfig(rl),
               timeout=RELOAD_TIMEOUT, what="the edit live", log=rl.log)
