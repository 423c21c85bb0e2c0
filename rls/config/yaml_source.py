"""Reading YAML the way the reference's yaml.v2 does, and typed access to its scalars.

Scalars keep their source text where the reference would (`value: 007` stays "007"), `1e3` is
a float, timestamps stay strings. Type errors read like the reference's unmarshal errors.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from typing import Any

import yaml

from rls.config.errors import ConfigError

UINT32_MAX = 4294967295


class YamlInt(int):
    """An int that remembers its source text.

    The reference's YAML library keeps a scalar's text when the target field is a string, so
    `value: 007` stays "007" (not 7) and `value: yes` stays "yes" (not true).
    """

    raw: str


class YamlBool:
    """A YAML 1.1 boolean (`true`, `yes`, `Off`…) that remembers its source text."""

    __slots__ = ("raw", "value")

    def __init__(self, value: bool, raw: str) -> None:
        self.value = value
        self.raw = raw

    def __bool__(self) -> bool:
        return self.value

    def __repr__(self) -> str:
        return self.raw


class YamlMap(dict):  # type: ignore[type-arg]
    """A mapping that remembers where it is: its line, each key's line, and repeated keys.

    Config errors point at `file:line`; a key given twice in one mapping (YAML keeps the last
    one silently) is reported as a warning by the parser.
    """

    line: int = 0
    next_document_line: int | None = None  # a second document follows (`---`), ignored
    key_lines: dict[Any, int]
    duplicates: list[tuple[Any, int]]

    def line_of(self, key: Any) -> int:
        return self.key_lines.get(key, self.line) if hasattr(self, "key_lines") else self.line


def line_of(mapping: Any, key: Any = None) -> int | None:
    """Line of `key` in a mapping read by parse_yaml (or of the mapping itself); None if unknown."""
    if isinstance(mapping, YamlMap):
        return mapping.line_of(key) if key is not None else mapping.line
    return None


class _Loader(yaml.SafeLoader):
    """SafeLoader resolving scalars like the reference's yaml.v2: timestamps stay strings,
    `1e3` is a float, and ints and bools keep their text for string fields."""

    yaml_implicit_resolvers = {
        first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:timestamp"]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        value = YamlInt(super().construct_yaml_int(node))
        value.raw = node.value
        return value

    def construct_yaml_bool(self, node: yaml.ScalarNode) -> YamlBool:  # type: ignore[override]
        return YamlBool(super().construct_yaml_bool(node), node.value)

    def construct_yaml_map(self, node: yaml.MappingNode) -> Any:
        data = YamlMap()
        data.line = node.start_mark.line + 1
        data.key_lines = {}
        data.duplicates = []
        yield data
        own = {id(k) for k, _ in node.value if k.tag != "tag:yaml.org,2002:merge"}
        self.flatten_mapping(node)  # `<<` merges: merged keys first, own keys override them
        set_by_own: set[Any] = set()
        for key_node, value_node in node.value:
            key = self.construct_object(key_node, deep=False)
            try:
                hash(key)
            except TypeError:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping", node.start_mark,
                    "found unhashable key", key_node.start_mark,
                ) from None
            line = key_node.start_mark.line + 1
            if id(key_node) in own:
                if key in set_by_own:
                    data.duplicates.append((key, line))
                set_by_own.add(key)
            data[key] = self.construct_object(value_node, deep=False)
            data.key_lines[key] = line


_Loader.add_constructor("tag:yaml.org,2002:int", _Loader.construct_yaml_int)
_Loader.add_constructor("tag:yaml.org,2002:bool", _Loader.construct_yaml_bool)
_Loader.add_constructor("tag:yaml.org,2002:map", _Loader.construct_yaml_map)
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9]+[eE][-+]?[0-9]+$"), list("-+0123456789")
)


@dataclass(frozen=True, slots=True)
class YamlBudget:
    """What one YAML document may cost before it is rejected (docs/reliability.md, "Hostile
    config directories").

    `max_nodes` counts the tree as the parser will walk it, aliases expanded: ten aliases of
    an anchor holding ten aliases… ("billion laughs") compose into a few hundred nodes but
    expand into billions. `max_depth` bounds nesting before Python's recursion limit is near.
    `deadline` is a `time.monotonic()` instant checked while the text is scanned and composed.
    """

    max_nodes: int = 1_000_000
    max_depth: int = 200
    deadline: float = float("inf")


DEFAULT_BUDGET = YamlBudget()


class _BudgetError(Exception):
    """Raised inside the composer; turned into a ConfigError naming the file and line."""

    def __init__(self, line: int, message: str) -> None:
        super().__init__(message)
        self.line = line
        self.message = message


class _BudgetLoader(_Loader):
    """`_Loader` that counts and bounds the nodes it composes (see YamlBudget)."""

    def __init__(self, text: str, budget: YamlBudget) -> None:
        super().__init__(text)
        self.budget = budget
        self.depth = 0
        self.composed = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        self.depth += 1
        self.composed += 1
        try:
            if self.depth > self.budget.max_depth:
                raise _BudgetError(
                    self._line(), f"nested deeper than {self.budget.max_depth} levels"
                )
            if self.composed & 1023 == 0 and time.monotonic() > self.budget.deadline:
                raise _BudgetError(self._line(), "time budget exceeded while parsing")
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def _line(self) -> int:
        event: Any = self.peek_event()  # type: ignore[no-untyped-call]
        return int(event.start_mark.line) + 1


def _expanded_size(root: yaml.Node, budget: YamlBudget) -> None:
    """Count `root`'s nodes with aliases expanded; raise _BudgetError past the budget.

    Linear in the composed graph (sizes are memoised per node), so a billion-laughs document
    is rejected at once instead of being walked. An anchor that contains itself is rejected
    too: nothing in a descriptor file can be infinite.
    """
    sizes: dict[int, int] = {}
    active: set[int] = set()

    def size(node: yaml.Node) -> int:
        key = id(node)
        known = sizes.get(key)
        if known is not None:
            return known
        if key in active:
            raise _BudgetError(
                node.start_mark.line + 1, "a YAML anchor that contains itself"
            )
        active.add(key)
        total = 1
        if isinstance(node, yaml.SequenceNode):
            for item in node.value:
                total += size(item)
        elif isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                total += size(k) + size(v)
        active.discard(key)
        if total > budget.max_nodes:
            raise _BudgetError(
                node.start_mark.line + 1,
                f"more than {budget.max_nodes} nodes once aliases are expanded",
            )
        sizes[key] = total
        return total

    size(root)


def parse_yaml(file: str, text: str, budget: YamlBudget = DEFAULT_BUDGET) -> Any:
    """First YAML document of `text` (the reference reads only the first), within `budget`."""
    loader: _BudgetLoader | None = None
    try:
        loader = _BudgetLoader(text, budget)  # the reader checks the characters here
        if not loader.check_node():
            return None
        node = loader.get_node()
        if node is None:
            return None
        _expanded_size(node, budget)
        doc = loader.construct_document(node)
        if isinstance(doc, YamlMap):
            doc.next_document_line = _next_document_line(loader, text)
        return doc
    except _BudgetError as exc:
        raise ConfigError(
            file, f"error loading config file: yaml: line {exc.line}: {exc.message}"
        ) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise ConfigError(
            file, f"error loading config file: {_yaml_error(exc)}",
            line=None if mark is None else mark.line + 1,
            column=None if mark is None else mark.column + 1,
            hint=_quoting_hint(exc, text) or _syntax_hint(exc),
        ) from None
    except (ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:
        # PyYAML's constructors raise plain errors for bad tagged scalars (`!!int x`).
        raise ConfigError(file, f"error loading config file: yaml: bad scalar: {exc}") from None
    except RecursionError:
        raise ConfigError(file, "error loading config file: yaml: nested too deeply") from None
    finally:
        if loader is not None:
            loader.dispose()


def _next_document_line(loader: yaml.SafeLoader, text: str) -> int | None:
    """Line of a second, non-empty document's start, if any: the reference ignores it silently,
    so the parser warns. Only its first event is read; whatever follows it is never parsed."""
    try:
        if not loader.check_node():
            return None
        mark = loader.peek_event().start_mark  # type: ignore[no-untyped-call]
    except yaml.YAMLError:
        return None
    rest = text[mark.index:].lstrip().removeprefix("---")
    if all(not line.strip() or line.lstrip().startswith("#") for line in rest.splitlines()):
        return None  # a trailing `---`: an empty document
    return int(mark.line) + 1


def _yaml_error(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    # One line: some errors (a NUL or other unreadable character) render on several lines.
    problem = " ".join(str(getattr(exc, "problem", None) or exc).split())
    if mark is not None:
        return f"yaml: line {mark.line + 1}: {problem}"
    return f"yaml: {problem}"


# What the parser's words usually mean in a hand-written config (most YAML errors there are
# indentation): the parser's text is kept (the reference prints it), the hint says what to fix.
_INDENTATION = (
    "check this line's indentation against the lines above it: keys of one mapping start "
    "in the same column, and a key's fields are indented under it"
)
_SYNTAX_HINTS = (
    ("mapping values are not allowed here",
     "a `key:` YAML did not expect here: usually this line is indented deeper than the "
     "keys beside it, or a value holds ': ' (quote the value)"),
    ("expected <block end>", _INDENTATION),
    ("could not find expected ':'", _INDENTATION),
    ("did not find expected key", _INDENTATION),
    ("did not find expected '-' indicator", _INDENTATION),
    ("found character '\\t'", "YAML indents with spaces only: replace the tab"),
)


def _syntax_hint(exc: yaml.YAMLError) -> str | None:
    """What to fix for the usual YAML syntax errors (indentation, tabs); None otherwise."""
    problem = str(getattr(exc, "problem", None) or "")
    for words, hint in _SYNTAX_HINTS:
        if words in problem:
            return hint
    return None


# Characters that start YAML syntax when they begin a plain (unquoted) value.
_INDICATORS = {"*": "starts an alias", "&": "starts an anchor", "!": "starts a tag",
               "|": "starts a block scalar", ">": "starts a folded block scalar",
               "@": "is reserved", "`": "is reserved"}


def _quoting_hint(exc: yaml.YAMLError, text: str) -> str | None:
    """For a value that YAML read as syntax (`value: *admin*`, a wildcard written unquoted):
    say to quote it, showing the quoted value. None for any other YAML error."""
    mark = getattr(exc, "context_mark", None) or getattr(exc, "problem_mark", None)
    if mark is None:
        return None
    lines = text.splitlines()
    if not 0 <= mark.line < len(lines):
        return None
    rest = lines[mark.line][mark.column:]
    if not rest or rest[0] not in _INDICATORS:
        return None
    value = re.split(r"[,\]}]|\s#", rest, maxsplit=1)[0].strip()
    quoted = json.dumps(value) if '"' not in value else "'" + value.replace("'", "''") + "'"
    return (f"{rest[0]!r} at the start of a value {_INDICATORS[rest[0]]} in YAML; "
            f"quote the value: {quoted}")


def render(value: Any) -> str:
    """A YAML value as Go's `%v` prints it, for the reference's error messages:
    `<nil>`, `[a b]`, `map[k:v]` (keys sorted)."""
    if isinstance(value, (YamlBool, YamlInt)):
        return value.raw
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "<nil>"
    if isinstance(value, list):
        return "[" + " ".join(render(item) for item in value) + "]"
    if isinstance(value, dict):
        pairs = sorted(f"{render(k)}:{render(v)}" for k, v in value.items())
        return "map[" + " ".join(pairs) + "]"
    return str(value)


def as_str(file: str, value: Any, field: str) -> str:
    if value is None:
        return ""
    if isinstance(value, (YamlInt, YamlBool)):
        return value.raw
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, int)):
        return str(value)
    raise ConfigError(
        file,
        f"error loading config file: yaml: unmarshal errors: cannot unmarshal {field}",
        field=field,
    )


def as_bool(file: str, value: Any, field: str) -> bool:
    if value is None:
        return False
    if isinstance(value, YamlBool):
        return value.value
    if isinstance(value, bool):
        return value
    raise ConfigError(
        file,
        "error loading config file: yaml: unmarshal errors: "
        f"cannot unmarshal {render(value)!r} into bool field '{field}'",
        field=field,
    )


def as_uint(file: str, value: Any, field: str, maximum: int = UINT32_MAX) -> int:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= maximum:
        raise ConfigError(
            file,
            "error loading config file: yaml: unmarshal errors: "
            f"cannot unmarshal {render(value)!r} into unsigned integer field '{field}'",
            field=field,
        )
    return value


def as_list(file: str, value: Any, field: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise ConfigError(
            file,
            "error loading config file: yaml: unmarshal errors: "
            f"cannot unmarshal {type(value).__name__} into list field '{field}'",
            field=field,
        )
    return value
