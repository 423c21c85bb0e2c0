"""Config errors carry the file they came from, so every message reads `file: message`.

`str(error)` is exactly the reference's `<file>: <message>` (operators and tests grep that
text). Where the problem is — the line in the file, the descriptor node path
(`domain.key_value.key`) and a "did you mean" for a misspelled key — travels alongside and is
shown by `detail()`, which check-config, reload logs and startup print.

A load reports every independent problem of a file at once (one fix-and-retry per file, not
per problem): one ConfigError then
carries them all in `problems`, in file and line order, and its own fields (`file`, `message`,
`line`, `node`, `hint`) are the first problem's, so a caller that knows of one error only still
reads a complete, located one. `Problems` gathers them while a file is parsed.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

T = TypeVar("T")


def did_you_mean(word: str, options: Iterable[str]) -> str | None:
    """A hint for a misspelled word among `options` (`requests_per_unti` ->
    `requests_per_unit`, `minutes` -> `minute`); None when nothing is close."""
    ordered = sorted(options)
    close = difflib.get_close_matches(word, ordered, n=1, cutoff=0.6)
    if not close:
        folded = word.replace("_", "").replace("-", "").lower()
        close = [k for k in ordered if k.replace("_", "").lower() == folded]
    return f"did you mean '{close[0]}'?" if close else None


class ConfigError(Exception):
    """A descriptor or cache file is invalid. `str()` is `<file>: <message>` like the reference.

    With several problems, `str()` and the fields are the first one's; `problems` has them all.
    """

    def __init__(
        self,
        file: str,
        message: str,
        *,
        line: int | None = None,
        node: str | None = None,
        hint: str | None = None,
        field: str | None = None,
        column: int | None = None,
    ) -> None:
        super().__init__(f"{file}: {message}")
        self.file = file
        self.message = message
        self.line = line  # 1-based line in `file`, when known
        self.node = node  # node path, e.g. `domain.user_alice.rate_limit.unit`
        self.hint = hint  # e.g. "did you mean 'rate_limit'?"
        self.field = field  # the YAML key whose value is wrong, when one is
        self.column = column  # 1-based column, when known (YAML syntax errors)
        self._more: tuple[ConfigError, ...] = ()  # the problems after this one

    @property
    def problems(self) -> tuple[ConfigError, ...]:
        """Every problem this error stands for, this one first (one problem: itself)."""
        return (self, *self._more)

    @classmethod
    def of(cls, problems: Sequence[ConfigError]) -> ConfigError:
        """One error standing for several: the first problem, carrying the others (nested
        groups are flattened; every problem keeps its own location)."""
        flat = [p.alone() for group in problems for p in group.problems]
        if not flat:
            raise ValueError("ConfigError.of needs at least one problem")
        if len(flat) == 1:
            return flat[0]
        lead = flat[0].alone(copy=True)
        lead._more = tuple(flat[1:])
        return lead

    def alone(self, copy: bool = False) -> ConfigError:
        """This problem without the ones it carries (itself when it carries none)."""
        if not self._more and not copy:
            return self
        return type(self)(
            self.file, self.message, line=self.line, node=self.node, hint=self.hint,
            field=self.field, column=self.column,
        )

    def locate(self, line: int | None, node: str | None) -> ConfigError:
        """Fill in the location if nothing more precise was known where the error was raised."""
        if self.line is None:
            self.line = line
        if self.node is None:
            self.node = node
        return self

    def locate_in(self, container: object, node: str) -> ConfigError:
        """`locate` every problem at its own field's line in `container` (a mapping read by
        rls.config.yaml_source, which knows its lines) or the container's own line, and at
        `node`; problems already located keep theirs."""
        lines = getattr(container, "line_of", None)
        for problem in self.problems:
            field = problem.field
            if not isinstance(container, dict) or field not in container:
                field = None
            problem.locate(lines(field) if callable(lines) else None, node)
        return self

    def detail(self, sep: str = "\n") -> str:
        """Every problem as `file: message (at file:line, node path; hint)`, joined by `sep`
        (one problem: exactly its line) — the reference text stays a prefix of each."""
        return sep.join(problem.located() for problem in self.problems)

    def located(self) -> str:
        """This problem alone: `file: message (at file:line[:column], node path; hint)`."""
        where = []
        if self.line is not None:
            column = f":{self.column}" if self.column is not None else ""
            where.append(f"at {self.file}:{self.line}{column}")
        if self.node:
            where.append(f"node {self.node}")
        extra = ", ".join(where)
        if self.hint:
            extra = f"{extra}; {self.hint}" if extra else self.hint
        return f"{self} ({extra})" if extra else str(self)


class Problems:
    """The independent problems of one load, gathered so that all are reported at once.

    `check(default, fn, ...)` runs one independent step and keeps its ConfigError instead of
    letting it end the load; `raise_if_any()` raises them together (`ConfigError.of`), sorted
    by file (in load order) and line, at most one per line: a second error on a line already
    reported is the same problem seen by a later pass (the key check, then the typed parse).
    """

    def __init__(self) -> None:
        self.found: list[ConfigError] = []

    def add(self, error: ConfigError) -> None:
        self.found.extend(problem.alone() for problem in error.problems)

    def check(self, default: T, fn: Callable[..., T], *args: object) -> T:
        """`fn(*args)`, or `default` with its ConfigError kept (the steps after go on with
        the default; a check that depends on a failed step is left out, not reported)."""
        try:
            return fn(*args)
        except ConfigError as exc:
            self.add(exc)
            return default

    def __bool__(self) -> bool:
        return bool(self.found)

    def raise_if_any(self) -> None:
        if not self.found:
            return
        order: dict[str, int] = {}
        for problem in self.found:
            order.setdefault(problem.file, len(order))
        ranked = sorted(self.found, key=lambda p: (order[p.file], p.line or 0))
        kept: list[ConfigError] = []
        lines: set[tuple[str, int]] = set()
        for problem in ranked:
            if problem.line is not None:
                if (problem.file, problem.line) in lines:
                    continue
                lines.add((problem.file, problem.line))
            kept.append(problem)
        self.found = kept
        raise ConfigError.of(kept)


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
        ).located()

    def as_error(self) -> ConfigError:
        return ConfigError(self.file, self.message, line=self.line, node=self.node)
