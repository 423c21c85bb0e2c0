"""System programs the tests run, found on PATH; scripts/install-test-deps.sh installs them.

Nothing is installed mid-run (an apt lock held by anything else would fail a test at random):
a missing program fails its tests with one line naming the script.
"""

from __future__ import annotations

import shutil

import pytest

INSTALL_SCRIPT = "scripts/install-test-deps.sh"


def require_binary(name: str, package: str) -> str:
    """Absolute path of `name`, or fail the test saying how to install it."""
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed (Debian package {package}): run {INSTALL_SCRIPT} "
                    "first (it installs every system package the tests use; needs apt and root)")
    return found
