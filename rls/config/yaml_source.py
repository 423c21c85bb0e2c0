"""Reading YAML the way the reference's yaml.v2 does, and typed access to its scalars.

Scalars keep their source text where the reference would (`value: 007` stays "007"), `1e3` is
a float, timestamps stay strings. Type errors read like the reference's unmarshal errors.
"""

from __future__ import annotations

import re
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
    key_lines: dict[Any, int]
    duplicates: list[tuple[Any, int]]

    def line_of(self, key: Any) -> int:
        return self.key_lines.get(key, self.line) if hasattr(self, "key_lines") else self.line


class _Loader(yaml.SafeLoader):
    """SafeLoader resolving scalars like the reference's yaml.v2: timestamps stay strings,
    `1e3` is a float, and ints and bools keep their text for string fields."""

    yaml_implicit_resolvers = {
        first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:timestamp"]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:  # type: ignore[override]
        value = YamlInt(super().construct_yaml_int(node))
        value.raw = node.value
        return value

    def construct_yaml_bool(self, node: yaml.ScalarNode) -> YamlBool:  # type: ignore[override]
        return YamlBool(super().construct_yaml_bool(node), node.value)

    def construct_yaml_map(self, node: yaml.MappingNode) -> Any:  # type: ignore[override]
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


def parse_yaml(file: str, text: str) -> Any:
    """First YAML document of `text` (the reference reads only the first)."""
    try:
        for doc in yaml.load_all(text, Loader=_Loader):  # a SafeLoader subclass
            return doc
        return None
    except yaml.YAMLError as exc:
        raise ConfigError(file, f"error loading config file: {_yaml_error(exc)}") from None
    except (ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:
        # PyYAML's constructors raise plain errors for bad tagged scalars (`!!int x`).
        raise ConfigError(file, f"error loading config file: yaml: bad scalar: {exc}") from None
    except RecursionError:
        raise ConfigError(file, "error loading config file: yaml: nested too deeply") from None


def _yaml_error(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    if mark is not None:
        return f"yaml: line {mark.line + 1}: {problem}"
    return f"yaml: {problem}"


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
