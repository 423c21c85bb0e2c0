"""Where the demo's default files live: the checkout's `config/` and `envoy/` directories.

Kept apart because the lookup is relative to this file's place in the package: moving the
module changes how many parents up the checkout is (tests/deploy/test_demo.py pins the result).
"""

from __future__ import annotations

from pathlib import Path


def repo_root() -> Path:
    """The checkout this package runs from (editable install), else the working directory."""
    here = Path(__file__).resolve().parents[2]  # rls/demo/paths.py -> rls/demo -> rls -> root
    return here if (here / "config").is_dir() else Path.cwd()


def default_config_dir() -> Path:
    """The descriptor files `rls demo` serves unless `--config` says otherwise."""
    return repo_root() / "config"


def default_envoy_config(*, cache: bool, quota: bool) -> Path:
    """The Envoy config of each demo mode: quota (RLQS), response cache, or plain rate limit."""
    name = "gateway-rlqs.yaml" if quota else "gateway-cache.yaml" if cache else "gateway.yaml"
    return repo_root() / "envoy" / name
