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

Needs root (mount, chroot); the network is the host's (ports are reached from the test).
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


def contained(root: Path, argv: Sequence[str], env: Mapping[str, str], *,
              user: int | None = None, read_only_root: bool = False,
              binds: Sequence[Bind] = ()) -> list[str]:
    """The host command that runs `argv` in `root` as described in the module docstring."""
    r = shlex.quote(str(root))
    lines = [
        "set -eu",
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
    inner = ["/usr/bin/env", "-i", *(f"{k}={v}" for k, v in env.items()), *argv]
    if user is not None:
        inner = ["/usr/bin/setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups",
                 "--no-new-privs", "--inh-caps=-all", "--bounding-set=-all", *inner]
    lines.append(f"exec chroot {r} {shlex.join(inner)}")
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", "\n".join(lines)]
