"""The image answers to Envoy Gateway's `Command: ["/bin/ratelimit"]` (no Docker engine
needed: the Dockerfile and pyproject are read, the entry point imported)."""

from __future__ import annotations

import re
import tomllib
from importlib import import_module
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bin_ratelimit_is_the_ratelimit_console_script_of_the_image_venv() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, func = scripts["ratelimit"].partition(":")
    assert module == "rls.cli.ratelimit_entry"
    assert callable(getattr(import_module(module), func))
    dockerfile = (ROOT / "Dockerfile").read_text()
    final = dockerfile.rpartition("\nFROM ")[2]  # the runtime stage
    venv = re.search(r"python -m venv (\S+)", final)
    assert venv, "the runtime stage installs rls into a venv"
    assert f"ln -s {venv.group(1)}/bin/ratelimit /bin/ratelimit" in final
