"""The demo's one error type, apart so every step can raise it without importing the others."""

from __future__ import annotations


class DemoError(Exception):
    """A problem the user can fix (missing binary, port in use, bad path): exit 2."""
