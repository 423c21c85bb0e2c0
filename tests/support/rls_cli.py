"""Running the installed `rls` console command, as a new user does (not `python -m rls`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RLS = str(Path(sys.executable).parent / "rls")


def clean_env(**extra: str) -> dict[str, str]:
    """The environment without RLS_* and reference variables that would change settings."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("RLS_") and k not in ("LOG_LEVEL", "LOG_FORMAT", "SHADOW_MODE")
    }
    env.update(extra)
    return env


def rls(*args: str, env: dict[str, str] | None = None, timeout: float = 60,
        cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [RLS, *args], capture_output=True, text=True, timeout=timeout,
        env=clean_env(**(env or {})), cwd=str(cwd),
    )
