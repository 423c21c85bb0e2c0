"""Config errors carry the file they came from, so every message reads `file: message`."""

from __future__ import annotations


class ConfigError(Exception):
    """A descriptor or cache file is invalid. `str()` is `<file>: <message>` like the reference."""

    def __init__(self, file: str, message: str) -> None:
        super().__init__(f"{file}: {message}")
        self.file = file
        self.message = message
