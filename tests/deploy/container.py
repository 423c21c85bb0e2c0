"""A process in a root filesystem the way a container runtime starts it, without one.

`contained()` returns the command that runs `argv` chrooted into `root` in a mount namespace
of its own (unshare --mount: nothing it mounts is seen outside, and the mounts go away with
it), with what a Kubernetes container gets: /proc, a /dev of the usual device files, a /dev/shm
tmpfs, the volumes bound in, and optionally the root filesystem read-only (the root is
bind-mounted on itself and remounted read-only: any write fails with EROFS). The environment
is exactly `env` (env -i), the user a plain uid/gid with no supplementary groups, no
capabilities and no_new_privs (setpriv), as `runAsUser`, `allowPrivilegeEscalation: false`
and `capabilities: drop: [ALL]` give. Each step in between execs the next, so the process
started is, in the end, `argv` itself: its pid is the Popen's, signals reach it directly.

Needs root (mount, chroot). The network is the host's (the test reaches the ports), or with
`own_network` one of its own.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
DEV_LINKS = {"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1",
             "stderr": "/proc/self/fd/2"}


@dataclass(frozen=True)
class Bind:
    """`source` (a host file or directory) seen at `target` inside the root."""

    source: Path
    target: str
    read_only: bool = True


def host_can_contain() -> str | None:
    """Why this host cannot run `contained()`, or None."""
    if os.geteuid() != 0:
        return "needs root (mount namespaces, chroot, setpriv to another uid)"
    for tool in ("unshare", "chroot", "mount"):
        if not any(Path(d, tool).exists() for d in os.get_exec_path()):
            return f"needs {tool} (util-linux / coreutils)"
    return None


def as_user(user: int | None, argv: Sequence[str], env: Mapping[str, str]) -> list[str]:
    """`argv` (inside the root) with exactly `env`, as uid and gid `user` when given."""
    inner = ["/usr/bin/env", "-i", *(f"{k}={v}" for k, v in env.items()), *argv]
    if user is None:
        return inner
    return ["/usr/bin/setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups",
            "--no-new-privs", "--inh-caps=-all", "--bounding-set=-all", *inner]


def contained(root: Path, argv: Sequence[str], env: Mapping[str, str], *,
              user: int | None = None, read_only_root: bool = False,
              binds: Sequence[Bind] = (), own_network: bool = False) -> list[str]:
    """The host command that runs `argv` in `root` as described in the module docstring;
    `own_network`: in a network namespace of its own, loopback only (fixed ports collide with
    nothing; reach it with `beside()`)."""
    r = shlex.quote(str(root))
    lines = [
        "set -eu",
        *(["ip link set lo up"] if own_network else []),
        f"mount --bind {r} {r}",
        f"mount -t proc -o nosuid,nodev,noexec proc {r}/proc",
        f"mount -t tmpfs -o nosuid,mode=755,size=1m dev {r}/dev",
        f"mkdir {r}/dev/shm",
        f"mount -t tmpfs -o nosuid,nodev,mode=1777,size=64m shm {r}/dev/shm",
    ]
    for device in DEVICES:
        lines += [f"touch {r}/dev/{device}", f"mount --bind /dev/{device} {r}/dev/{device}"]
    lines += [f"ln -s {shlex.quote(to)} {r}/dev/{name}" for name, to in DEV_LINKS.items()]
    for bind in binds:
        assert bind.target.startswith("/"), bind
        inside = shlex.quote(f"{root}{bind.target}")
        source = shlex.quote(str(bind.source))
        # The runtime makes the mount point when the image lacks it (so do we, before the
        # root turns read-only).
        make = f"mkdir -p {inside}" if bind.source.is_dir() else (
            f"mkdir -p $(dirname {inside}) && touch {inside}")
        lines += [f"[ -e {inside} ] || {{ {make}; }}", f"mount --bind {source} {inside}"]
        if bind.read_only:
            lines.append(f"mount -o remount,bind,ro {inside}")
    if read_only_root:
        lines.append(f"mount -o remount,bind,ro {r}")
    lines.append(f"exec chroot {r} {shlex.join(as_user(user, argv, env))}")
    unshare = ["unshare", "--mount", *(["--net"] if own_network else []), "--propagation",
               "private"]
    return [*unshare, "sh", "-c", "\n".join(lines)]


def beside(pid: int, argv: Sequence[str], env: Mapping[str, str],
           user: int | None = None) -> list[str]:
    """The host command that runs `argv` in the mounts, network and root of the contained
    process `pid`, as Docker runs a HEALTHCHECK or `docker exec` a command."""
    return ["nsenter", f"--target={pid}", "--mount", "--net", "--root", "--wd",
            *as_user(user, argv, env)]
