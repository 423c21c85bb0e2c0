"""`rls demo --quota --smoke`: the quota-mode gateway comes up and Envoy enforces the limit."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.envoy]


def test_demo_quota_smoke_passes_on_free_ports() -> None:
    done = subprocess.run([sys.executable, "-m", "rls", "demo", "--quota", "--smoke",
                           "--free-ports"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "smoke test passed" in done.stdout
    assert "FAIL" not in done.stdout
    assert "quota-descriptors.yaml" in done.stdout
