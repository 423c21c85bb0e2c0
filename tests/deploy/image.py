"""The Dockerfile's runtime stage, replayed on a Debian root filesystem without a Docker engine.

The base image (`python:3.11-slim-<suite>`) stands as a `debootstrap --variant=minbase` root of
the same Debian suite with Debian's python3 and python3-venv (the same Python minor version,
checked), `python` linked in /usr/local/bin where the python image has it, and the python
image's PATH and LANG. On it, every instruction of the Dockerfile's last stage is applied as
Docker would: ENV accumulates, COPY copies from the repository (or, `--from=build`, the wheel
`pip wheel --no-deps .` built), RUN runs verbatim in the root (chroot, as root, network on),
and USER, EXPOSE, HEALTHCHECK, ENTRYPOINT and CMD are recorded. An instruction this file does
not know fails the build, so the replay cannot silently drift from the Dockerfile.

One departure, for speed: the RUN's pip installs the dependency wheels from a local
wheelhouse (PIP_NO_INDEX, PIP_FIND_LINKS in the build environment only), which `pip download`
fills from the package index once per set of requirements (the wheel's Requires-Dist) and
Python version. The resolution is the same; the versions are those of the day it was filled.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import ssl
import subprocess
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from support.system import require_binary

from .cache import cached
from .container import Bind, contained
from .runtime_stage import PYTHON_IMAGE_ENV, base_image, parse_env
from .test_dockerfile import DOCKERFILE, exec_form, stages

ROOT = DOCKERFILE.parent
DEBOOTSTRAP_PACKAGES = "python3,python3-venv"
BUILD_TIMEOUT_S = 1200
DEBIAN_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"  # ca-certificates' bundle
PROXY_VARIABLES = ("http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY",
                   "NO_PROXY")


@dataclass
class Image:
    """A replayed image: its root and the metadata Docker would keep."""

    root: Path
    env: dict[str, str]
    user: str = "0"
    entrypoint: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)
    exposed: set[int] = field(default_factory=set)
    healthcheck: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------- the base root


def debian_mirror(suite: str) -> str:
    """The Debian archive apt is configured with on this host (its sources lists)."""
    texts = [p.read_text() for p in sorted(Path("/etc/apt").glob("sources.list*"))
             if p.is_file()]
    texts += [p.read_text() for p in sorted(Path("/etc/apt/sources.list.d").glob("*"))
              if p.suffix in (".list", ".sources")]
    uris = []
    for text in texts:
        uris += re.findall(r"^\s*deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s", text, re.M)  # one-line form
        uris += [u for line in re.findall(r"^URIs:\s*(.+)$", text, re.M) for u in line.split()]
    archives = [u.rstrip("/") for u in uris if u.rstrip("/").endswith("/debian")]
    assert archives, (f"no Debian archive in /etc/apt's sources lists to debootstrap {suite} "
                      "from")
    return archives[0]


def _debootstrap(suite: str, tarball: Path) -> None:
    debootstrap = require_binary("debootstrap", "debootstrap")
    work = tarball.with_name(tarball.name + ".root")
    done = subprocess.run(
        [debootstrap, "--variant=minbase", f"--include={DEBOOTSTRAP_PACKAGES}", suite,
         str(work), debian_mirror(suite)],
        capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    assert done.returncode == 0, f"debootstrap {suite} failed:\n{done.stdout[-3000:]}"
    # As the slim images are: no package cache, no package lists.
    for leftover in ("var/cache/apt/archives", "var/lib/apt/lists"):
        for path in (work / leftover).glob("*"):
            if path.is_file():
                path.unlink()
    subprocess.run(["tar", "--numeric-owner", "-C", str(work), "-cf", str(tarball), "."],
                   check=True, timeout=600)
    subprocess.run(["rm", "-rf", "--one-file-system", str(work)], check=True, timeout=600)


def base_rootfs_tarball() -> Path:
    """The cached tarball of the Debian root standing for the base image (debootstrap once:
    minutes)."""
    suite = base_image().group("suite")
    name = f"rootfs/debian-{suite}-minbase-{DEBOOTSTRAP_PACKAGES.replace(',', '-')}.tar"
    return cached(name, lambda path: _debootstrap(suite, path))


def unpack(tarball: Path, root: Path) -> None:
    root.mkdir(parents=True)
    subprocess.run(["tar", "--numeric-owner", "-C", str(root), "-xpf", str(tarball)],
                   check=True, timeout=600)


# --------------------------------------------------------------------------- building


def host_ca_bundle() -> Path | None:
    """The CA bundle the host's pip trusts (PIP_CERT, else the system's), lent to the build."""
    for candidate in (os.environ.get("PIP_CERT"), os.environ.get("SSL_CERT_FILE"),
                      ssl.get_default_verify_paths().cafile, DEBIAN_CA_BUNDLE):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


def build_env(image_env: dict[str, str]) -> dict[str, str]:
    """What a RUN sees: the image's ENV, root's HOME, the host's proxies and CA bundle."""
    env = {**image_env, "HOME": "/root"}
    env.update({k: os.environ[k] for k in PROXY_VARIABLES if k in os.environ})
    if host_ca_bundle() is not None:
        env["PIP_CERT"] = "/run/build/ca.crt"
    return env


def build_binds(wheelhouse: Path, fill: bool = False) -> list[Bind]:
    """The host's resolver, the wheelhouse (writable to `fill` it) and the CA bundle."""
    binds = [Bind(Path("/etc/resolv.conf"), "/etc/resolv.conf"),
             Bind(wheelhouse, "/run/build/wheelhouse", read_only=not fill)]
    ca = host_ca_bundle()
    if ca is not None:
        binds.append(Bind(ca, "/run/build/ca.crt"))
    return binds


def run_build_step(root: Path, script: str, env: dict[str, str], binds: list[Bind],
                   what: str) -> None:
    """`sh -c script` in the root as root, the way `docker build` runs a RUN."""
    command = contained(root, ["/bin/sh", "-c", f"umask 022\n{script}"], env, binds=binds)
    done = subprocess.run(command, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    assert done.returncode == 0, f"{what} failed ({done.returncode}):\n{done.stdout[-4000:]}" \
        f"\n{done.stderr[-4000:]}"
    # The mount points made for the build's own binds are not part of the image.
    subprocess.run(["rm", "-rf", str(root / "run/build")], check=True, timeout=60)


def build_wheel(out: Path) -> Path:
    """The build stage: `pip wheel --no-deps` of the repository."""
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                           "--wheel-dir", str(out), str(ROOT)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"pip wheel failed:\n{done.stderr[-4000:]}"
    (wheel,) = out.glob("rls-*.whl")
    return wheel


def requirements(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as archive:
        (metadata,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        text = archive.read(metadata).decode()
    return sorted(re.findall(r"^Requires-Dist: (.+)$", text, re.M))


def wheelhouse(tarball: Path, wheel: Path, scratch: Path) -> Path:
    """The dependency wheels of `wheel` for the root's Python, downloaded once by the root's
    own pip (`pip download`, in a throwaway copy of the root) and cached."""
    key = hashlib.sha256(json.dumps([tarball.name, requirements(wheel)]).encode()).hexdigest()

    def download(target: Path) -> None:
        target.mkdir()
        root = scratch / "download-root"
        unpack(tarball, root)
        try:
            binds = [*build_binds(target, fill=True), Bind(wheel.parent, "/run/build/wheels")]
            script = ("python3 -m venv /tmp/pip && /tmp/pip/bin/pip download -q "
                      f"--dest /run/build/wheelhouse /run/build/wheels/{wheel.name}")
            run_build_step(root, script, build_env(dict(PYTHON_IMAGE_ENV)), binds,
                           "pip download of the image's dependencies")
        finally:
            subprocess.run(["rm", "-rf", "--one-file-system", str(root)], timeout=600)
        for own in target.glob("rls-*"):
            own.unlink()

    return cached(f"wheelhouse/{key[:24]}", download)


def replay_runtime_stage(root: Path, wheel: Path, wheels: Path) -> Image:
    """Apply the Dockerfile's last stage to the unpacked base `root` (see the module doc)."""
    python = base_image().group("python")
    found = subprocess.run(["chroot", str(root), "python3", "-c",
                            "import sys; print('%d.%d' % sys.version_info[:2])"],
                           capture_output=True, text=True, timeout=60).stdout.strip()
    assert found == python, f"the Debian root has Python {found}, the base image {python}"
    for name in ("python", "python3"):
        (root / "usr/local/bin" / name).symlink_to("/usr/bin/python3")
    image = Image(root, dict(PYTHON_IMAGE_ENV))
    for ins, args in stages()[-1]:
        if ins == "FROM":
            continue
        if ins == "ENV":
            image.env.update(parse_env(args, image.env))
        elif ins == "COPY":
            _copy(root, args, wheel)
        elif ins == "RUN":
            env = {**build_env(image.env), "PIP_NO_INDEX": "1",
                   "PIP_FIND_LINKS": "/run/build/wheelhouse"}
            run_build_step(root, args, env, build_binds(wheels), f"RUN {args[:60]}…")
        elif ins == "USER":
            image.user = args
        elif ins == "EXPOSE":
            image.exposed = {int(p.split("/")[0]) for p in args.split()}
        elif ins == "HEALTHCHECK":
            image.healthcheck = exec_form(args.partition("CMD")[2].strip())
        elif ins == "ENTRYPOINT":
            image.entrypoint = exec_form(args)
        elif ins == "CMD":
            image.cmd = exec_form(args)
        else:
            raise AssertionError(f"the Dockerfile's {ins} is not replayed by {__file__}")
    return image


def _copy(root: Path, args: str, wheel: Path) -> None:
    """COPY: files owned by root, modes kept; a directory source copies its contents."""
    *sources, dest = shlex.split(args)
    if sources[0].startswith("--from="):
        assert sources == ["--from=build", "/wheels"], f"COPY {args}: not the wheel of the build"
        paths = [wheel]
        dest = dest.rstrip("/") + "/"
    else:
        paths = [p for s in sources for p in sorted(ROOT.glob(s))]
        assert paths, f"COPY {args}: nothing in the repository"
    target = root / dest.lstrip("/")
    for path in paths:
        if path.is_dir():
            shutil.copytree(path, target, dirs_exist_ok=True)
            continue
        into = target / path.name if dest.endswith("/") or len(paths) > 1 else target
        into.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, into)
        into.chmod(path.stat().st_mode & 0o7777)


def build_image(scratch: Path) -> Image:
    """The runtime image, replayed under `scratch` (which must not exist)."""
    scratch.mkdir(parents=True)
    tarball = base_rootfs_tarball()
    wheel = build_wheel(scratch / "wheels")
    wheels = wheelhouse(tarball, wheel, scratch)
    root = scratch / "root"
    unpack(tarball, root)
    return replay_runtime_stage(root, wheel, wheels)

