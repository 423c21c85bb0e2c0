"""Config errors carry the file they came from, so every message reads `file: message`.

`str(error)` is exactly the reference's `<file>: <message>` (operators and tests grep that
text). Where the problem is — the line in the file, the descriptor node path
(`domain.key_value.key`) and a "did you mean" for a misspelled key — travels alongside and is
shown by `detail()`, which check-config, reload logs and startup print.
"""

from __future__ import annotations


class ConfigError(Exception):
    """A descriptor or cache file is invalid. `str()` is `<file>: <message>` like the reference."""

    def __init__(
        self,
        file: str,
        message: str,
        *,
        line: int | None = None,
        node: str | None = None,
        hint: str | None = None,
        field: str | None = None,
    ) -> None:
        super().__init__(f"{file}: {message}")
        self.file = file
        self.message = message
        self.line = line  # 1-based line in `file`, when known
        self.node = node  # node path, e.g. `domain.user_alice.rate_limit.unit`
        self.hint = hint  # e.g. "did you mean 'rate_limit'?"
        self.field = field  # the YAML key whose value is wrong, when one is

    def locate(self, line: int | None, node: str | None) -> ConfigError:
        """Fill in the location if nothing more precise was known where the error was raised."""
        if self.line is None:
            self.line = line
        if self.node is None:
            self.node = node
        return self

    def detail(self) -> str:
        """`file: message (at file:line, node path; hint)` — the reference text stays a prefix."""
        where = []
        if self.line is not None:
            where.append(f"at {self.file}:{self.line}")
        if self.node:
            where.append(f"node {self.node}")
        extra = ", ".join(where)
        if self.hint:
            extra = f"{extra}; {self.hint}" if extra else self.hint
        return f"{self} ({extra})" if extra else str(self)


class ConfigWarning:
    """Something that loads but is probably not what the author meant (an error with --strict).

    Printed like an error, `file: warning: message (at file:line, node path)`.
    """

    __slots__ = ("file", "line", "message", "node")

    def __init__(
        self, file: str, message: str, line: int | None = None, node: str | None = None
    ) -> None:
        self.file = file
        self.message = message
        self.line = line
        self.node = node

    def __str__(self) -> str:
        return ConfigError(
            self.file, f"warning: {self.message}", line=self.line, node=self.node
        ).detail()

    def as_error(self) -> ConfigError:
        return ConfigError(self.file, self.message, line=self.line, node=self.node)
