"""A minimal Go-template renderer for helm/rls (no helm binary here).

It implements only what the chart's templates use: `{{- -}}` trimming, comments, `define`,
`include`, `if / else if / else`, `with` (and its else), `range` over lists and maps (with
`$k, $v :=`), variables (`$x := ...`, `$`), pipelines, parenthesised calls, and the functions
in FUNCS. Unlike Helm it is strict: a missing map key (e.g. a `.Values` path that
values.yaml lacks) is an error, not an empty value, so typos fail the test instead of
rendering nothing. Anything outside that subset raises TemplateError: the renderer never
silently guesses.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml


class TemplateError(Exception):
    pass


# --------------------------------------------------------------------------- lexing

_ACTION = re.compile(r"\{\{(-\s)?(.*?)(\s-)?\}\}", re.DOTALL)


def lex(text: str) -> list[tuple[str, str]]:
    """[("text", s) | ("action", s)] with `{{-` / `-}}` whitespace trimming applied."""
    out: list[tuple[str, str]] = []
    pos = 0
    trim_next = False
    for m in _ACTION.finditer(text):
        chunk = text[pos:m.start()]
        if trim_next:
            chunk = chunk.lstrip()
        if m.group(1):
            chunk = chunk.rstrip()
        if chunk:
            out.append(("text", chunk))
        body = m.group(2).strip()
        if not (body.startswith("/*") and body.endswith("*/")):
            out.append(("action", body))
        trim_next = bool(m.group(3))
        pos = m.end()
    chunk = text[pos:]
    if trim_next:
        chunk = chunk.lstrip()
    if chunk:
        out.append(("text", chunk))
    return out


_TOKEN = re.compile(
    r"""\s*(?:
      (?P<str>"(?:[^"\\]|\\.)*")
    | (?P<raw>`[^`]*`)
    | (?P<num>-?\d+(?:\.\d+)?)
    | (?P<assign>:=)
    | (?P<punct>[()|,=])
    | (?P<var>\$[A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)*)
    | (?P<field>(?:\.[A-Za-z0-9_]+)+|\.)
    | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
    )""",
    re.VERBOSE,
)


def tokens(expr: str) -> list[tuple[str, str]]:
    out = []
    pos = 0
    expr = expr.strip()
    while pos < len(expr):
        m = _TOKEN.match(expr, pos)
        if not m or m.end() == pos:
            raise TemplateError(f"cannot tokenize {expr[pos:]!r} in {{{{ {expr} }}}}")
        kind = m.lastgroup
        assert kind is not None
        out.append((kind, m.group(kind)))
        pos = m.end()
    return out


# --------------------------------------------------------------------------- parsing


@dataclass
class Node:
    kind: str  # text | action | if | with | range | define
    text: str = ""
    expr: str = ""
    body: list[Node] = field(default_factory=list)
    branches: list[tuple[str, list[Node]]] = field(default_factory=list)  # if / else if
    orelse: list[Node] = field(default_factory=list)


def parse(items: list[tuple[str, str]], defines: dict[str, list[Node]]) -> list[Node]:
    pos = 0

    def block(stop: tuple[str, ...]) -> tuple[list[Node], str]:
        nonlocal pos
        nodes: list[Node] = []
        while pos < len(items):
            kind, value = items[pos]
            pos += 1
            if kind == "text":
                nodes.append(Node("text", text=value))
                continue
            word = value.split(None, 1)[0] if value else ""
            rest = value[len(word):].strip()
            if word in ("end", "else"):
                if word not in stop and not (word == "else" and "else" in stop):
                    raise TemplateError(f"unexpected {{{{ {value} }}}}")
                return nodes, value
            if word == "if":
                node = Node("if")
                cond, body = rest, None
                while True:
                    body, ended = block(("end", "else"))
                    node.branches.append((cond, body))
                    if ended == "end":
                        break
                    after = ended[4:].strip()
                    if after.startswith("if "):
                        cond = after[3:].strip()
                        continue
                    if after:
                        raise TemplateError(f"unsupported {{{{ {ended} }}}}")
                    node.orelse, _ = block(("end",))
                    break
                nodes.append(node)
            elif word in ("with", "range"):
                node = Node(word, expr=rest)
                node.body, ended = block(("end", "else"))
                if ended != "end":
                    if ended.strip() != "else":
                        raise TemplateError(f"unsupported {{{{ {ended} }}}}")
                    node.orelse, _ = block(("end",))
                nodes.append(node)
            elif word == "define":
                name = json.loads(rest)
                body, _ = block(("end",))
                defines[name] = body
            elif word in ("template", "block", "break", "continue"):
                raise TemplateError(f"{word} is not supported by minihelm")
            else:
                nodes.append(Node("action", expr=value))
        if stop:
            raise TemplateError(f"missing {{{{ end }}}} (wanted one of {stop})")
        return nodes, ""

    nodes, _ = block(())
    return nodes


# --------------------------------------------------------------------------- evaluation


def truthy(value: Any) -> bool:
    if value is None or value is False:
        return False
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value != 0
    if isinstance(value, (str, list, dict, tuple)):
        return len(value) > 0
    return True


def to_yaml(value: Any) -> str:
    if value is None:
        return "null"
    return yaml.safe_dump(value, default_flow_style=False, sort_keys=True).rstrip("\n")


def _indent(n: int, text: Any) -> str:
    pad = " " * int(n)
    return pad + str(text).replace("\n", "\n" + pad)


def _printf(fmt: str, *args: Any) -> str:
    return re.sub(r"%[vsd]", "{}", fmt).format(*args)


def _required(message: str, value: Any) -> Any:
    if not truthy(value):
        raise TemplateError(f"required: {message}")
    return value


def _and(*args: Any) -> Any:
    for a in args:
        if not truthy(a):
            return a
    return args[-1]


def _or(*args: Any) -> Any:
    for a in args:
        if truthy(a):
            return a
    return args[-1]


def _to_str(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return ""
    return str(v)


FUNCS: dict[str, Callable[..., Any]] = {
    "toYaml": to_yaml,
    "nindent": lambda n, s: "\n" + _indent(n, s),
    "indent": _indent,
    "quote": lambda v: json.dumps(_to_str(v)),
    "default": lambda d, v=None: v if truthy(v) else d,
    "printf": _printf,
    "trunc": lambda n, s: str(s)[: int(n)],
    "trimSuffix": lambda suf, s: str(s)[: -len(suf)] if suf and str(s).endswith(suf) else s,
    "replace": lambda old, new, s: str(s).replace(old, new),
    "contains": lambda sub, s: sub in str(s),
    "required": _required,
    "b64enc": lambda s: base64.b64encode(_to_str(s).encode()).decode(),
    "sha256sum": lambda s: hashlib.sha256(_to_str(s).encode()).hexdigest(),
    "int": lambda v: int(v or 0),
    "toString": _to_str,
    "not": lambda v: not truthy(v),
    "and": _and,
    "or": _or,
    "eq": lambda a, b: a == b,
    "ne": lambda a, b: a != b,
    "gt": lambda a, b: a > b,
    "empty": lambda v: not truthy(v),
}


class Renderer:
    def __init__(self, defines: dict[str, list[Node]]) -> None:
        self.defines = defines

    def render(self, nodes: list[Node], dot: Any, scope: dict[str, Any]) -> str:
        out: list[str] = []
        for node in nodes:
            if node.kind == "text":
                out.append(node.text)
            elif node.kind == "action":
                value = self.statement(node.expr, dot, scope)
                if value is not None:
                    out.append(_to_str(value))
            elif node.kind == "if":
                for cond, body in node.branches:
                    if truthy(self.pipeline(cond, dot, scope)):
                        out.append(self.render(body, dot, dict(scope)))
                        break
                else:
                    out.append(self.render(node.orelse, dot, dict(scope)))
            elif node.kind == "with":
                value = self.pipeline(node.expr, dot, scope)
                if truthy(value):
                    out.append(self.render(node.body, value, dict(scope)))
                else:
                    out.append(self.render(node.orelse, dot, dict(scope)))
            elif node.kind == "range":
                out.append(self.range(node, dot, scope))
        return "".join(out)

    def range(self, node: Node, dot: Any, scope: dict[str, Any]) -> str:
        names: list[str] = []
        expr = node.expr
        if ":=" in expr:
            left, expr = expr.split(":=", 1)
            names = [n.strip() for n in left.split(",")]
        value = self.pipeline(expr, dot, scope)
        if not truthy(value):
            return self.render(node.orelse, dot, dict(scope))
        if isinstance(value, dict):
            pairs = sorted(value.items())  # Go ranges over maps in key order
        elif isinstance(value, list):
            pairs = list(enumerate(value))
        else:
            raise TemplateError(f"range over {type(value).__name__}")
        out = []
        for key, item in pairs:
            inner = dict(scope)
            if len(names) == 2:
                inner[names[0]], inner[names[1]] = key, item
            elif len(names) == 1:
                inner[names[0]] = item
            out.append(self.render(node.body, item, inner))
        return "".join(out)

    def statement(self, expr: str, dot: Any, scope: dict[str, Any]) -> Any:
        m = re.match(r"^(\$[A-Za-z0-9_]+)\s*:?=\s*(.*)$", expr, re.DOTALL)
        if m:
            scope[m.group(1)] = self.pipeline(m.group(2), dot, scope)
            return None
        return self.pipeline(expr, dot, scope)

    def pipeline(self, expr: str, dot: Any, scope: dict[str, Any]) -> Any:
        toks = tokens(expr)
        value, pos = self._pipe(toks, 0, dot, scope)
        if pos != len(toks):
            raise TemplateError(f"unexpected {toks[pos][1]!r} in {{{{ {expr} }}}}")
        return value

    def _pipe(self, toks: list[tuple[str, str]], pos: int, dot: Any,
              scope: dict[str, Any]) -> tuple[Any, int]:
        value, pos = self._command(toks, pos, dot, scope, None, first=True)
        while pos < len(toks) and toks[pos] == ("punct", "|"):
            value, pos = self._command(toks, pos + 1, dot, scope, value, first=False)
        return value, pos

    def _command(self, toks: list[tuple[str, str]], pos: int, dot: Any, scope: dict[str, Any],
                 piped: Any, first: bool) -> tuple[Any, int]:
        kind, text = toks[pos]
        if (kind == "ident" and text in FUNCS) or (kind == "ident" and text == "include"):
            args = []
            pos += 1
            while pos < len(toks) and toks[pos] not in (("punct", "|"), ("punct", ")")):
                arg, pos = self._operand(toks, pos, dot, scope)
                args.append(arg)
            if not first:
                args.append(piped)
            if text == "include":
                name, data = args
                if name not in self.defines:
                    raise TemplateError(f"include of undefined template {name!r}")
                return self.render(self.defines[name], data, {"$": data}), pos
            return FUNCS[text](*args), pos
        if not first:
            raise TemplateError(f"cannot pipe into {text!r}")
        value, end = self._operand(toks, pos, dot, scope)
        if callable(value):  # a method such as .Files.Get "path"
            args = []
            while end < len(toks) and toks[end] not in (("punct", "|"), ("punct", ")")):
                arg, end = self._operand(toks, end, dot, scope)
                args.append(arg)
            return value(*args), end
        return value, end

    def _operand(self, toks: list[tuple[str, str]], pos: int, dot: Any,
                 scope: dict[str, Any]) -> tuple[Any, int]:
        kind, text = toks[pos]
        if kind == "punct" and text == "(":
            value, pos = self._pipe(toks, pos + 1, dot, scope)
            if pos >= len(toks) or toks[pos] != ("punct", ")"):
                raise TemplateError("missing )")
            return value, pos + 1
        if kind == "str":
            return json.loads(text), pos + 1
        if kind == "raw":
            return text[1:-1], pos + 1
        if kind == "num":
            return (float(text) if "." in text else int(text)), pos + 1
        if kind == "field":
            return self._path(dot, text, text), pos + 1
        if kind == "var":
            name, _, rest = text.partition(".")
            if name not in scope:
                raise TemplateError(f"undefined variable {name}")
            return (self._path(scope[name], "." + rest, text) if rest else scope[name]), pos + 1
        if kind == "ident" and text in ("true", "false", "nil"):
            return {"true": True, "false": False, "nil": None}[text], pos + 1
        if kind == "ident":
            raise TemplateError(f"unknown function {text!r}")
        raise TemplateError(f"unexpected {text!r}")

    @staticmethod
    def _path(value: Any, path: str, full: str) -> Any:
        if path == ".":
            return value
        for part in path.strip(".").split("."):
            if not isinstance(value, dict):
                raise TemplateError(f"{full}: {part!r} of a {type(value).__name__}")
            if part not in value:
                raise TemplateError(f"{full}: no key {part!r}")
            value = value[part]
        return value


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def _chart_file(chart_dir: Path, name: str) -> str:
    """`.Files.Get`: a file of the chart. Helm renders "" for a missing file; this fails."""
    path = (chart_dir / name).resolve()
    if chart_dir.resolve() not in path.parents or not path.is_file():
        raise TemplateError(f".Files.Get: no file {name!r} in the chart")
    return path.read_text()


def render_chart(chart_dir: Path, overrides: dict[str, Any] | None = None,
                 release: str = "demo", namespace: str = "rate-limit") -> dict[str, str]:
    """Template file name -> rendered text (partials and NOTES.txt included)."""
    chart = yaml.safe_load((chart_dir / "Chart.yaml").read_text())
    values = yaml.safe_load((chart_dir / "values.yaml").read_text()) or {}
    values = deep_merge(values, overrides or {})
    root = {
        "Values": values,
        "Release": {"Name": release, "Namespace": namespace, "Service": "Helm",
                    "IsInstall": True, "IsUpgrade": False, "Revision": 1},
        "Chart": {"Name": chart["name"], "Version": chart["version"],
                  "AppVersion": chart.get("appVersion", "")},
    }
    root["Files"] = {"Get": lambda name: _chart_file(chart_dir, name)}
    defines: dict[str, list[Node]] = {}
    parsed = {}
    templates = sorted((chart_dir / "templates").iterdir())
    for path in templates:
        parsed[path.name] = parse(lex(path.read_text()), defines)
    renderer = Renderer(defines)
    return {name: renderer.render(nodes, root, {"$": root}) for name, nodes in parsed.items()}
