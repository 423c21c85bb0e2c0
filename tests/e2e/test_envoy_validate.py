"""Every Envoy config shipped in envoy/ is accepted by the real Envoy 1.40 (`--mode validate`)."""

from __future__ import annotations

import subprocess

import pytest

from .harness import ENVOY_DIR

pytestmark = pytest.mark.envoy

CONFIGS = sorted(ENVOY_DIR.glob("*.yaml"))


def test_envoy_dir_has_configs() -> None:
    # An empty list would make the parametrized test below silently skip.
    assert CONFIGS, f"no *.yaml in {ENVOY_DIR}"


@pytest.mark.parametrize("config", CONFIGS, ids=[p.name for p in CONFIGS])
def test_envoy_validate(envoy_binary: str, config) -> None:
    result = subprocess.run(
        [envoy_binary, "--mode", "validate", "-c", str(config)],
        capture_output=True, text=True, timeout=60,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert f"configuration '{config}' OK" in output, output
