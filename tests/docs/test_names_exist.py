"""Issue 32 item 5: every file, module or function a comment or the architecture map names exists.

Code moves (rls/counters became rls/frequency, stores/redis.py a package, quota/limits.py
quota/bounds.py) and a comment naming the old place still reads as true. This scans
docs/architecture.md and the comments and docstrings of rls/**/*.py for

- repository paths (`rls/stores/guard.py`, `stores/deadline.py`, `lua/decide.lua`, `rls/quota/`),
  resolved from the repository root, from rls/, and from the citing file's own package upwards;
- dotted module names (`rls.quota.share`, `rls.core.usage.UsageStats`);
- backticked `module.name` / `Class.method` references whose first part is an rls module (by any
  dotted suffix of its name: `limiter`, `core.keys`) or an rls class,

and fails naming each one that does not resolve, with the file that cites it.
"""

from __future__ import annotations

import ast
import importlib
import io
import re
import tokenize
from collections import defaultdict
from pathlib import Path
from types import ModuleType

from support.rls_cli import ROOT

RLS = ROOT / "rls"
GENERATED = ("_pb2", "otlp_proto")
# Dotted names that look like rls modules but are not: gRPC package names of our own protos.
NOT_MODULES = ("rls.counters.v1", "rls.conf.v1")
# Paths outside the repository on purpose: the design notes' reference files, and placeholders.
EXTERNAL = re.compile(r"^(reference/|[A-Z]+/)")

EXTENSIONS = "py|lua|md|yaml|yml|sh|toml|proto"
FILE_NAME = re.compile(rf"\.(?:{EXTENSIONS})$")
PATH = re.compile(rf"(?<![\w./:-])((?:[\w-]+/)+[\w-]+\.(?:{EXTENSIONS}))\b")
RLS_DIR = re.compile(r"(?<![\w./:-])(rls/(?:\w+/)*\w*)(?![\w./])")
BACKTICKED_DIR = re.compile(r"`((?:\w+/)+)`")
BARE = re.compile(r"(?<![\w./-])([\w-]+\.(?:py|lua))\b")
DOTTED_RLS = re.compile(r"(?<![\w./-])(rls(?:\.\w+)+)")
BACKTICKED = re.compile(r"`([A-Za-z_]\w*(?:\.\w+)+)(?:\(\))?`")
# Unquoted in prose: only `module.name` / `Class.name` with an underscore or a capital in it,
# so a sentence's "e.g." or "i.e." never counts.
PROSE = re.compile(r"(?<![\w./`-])([A-Za-z_]\w*\.(?:_\w+|\w*[A-Z_]\w*))(?![\w(./-]*`)")


def sources() -> list[Path]:
    return sorted(
        p for p in RLS.rglob("*.py") if not any(g in str(p.relative_to(ROOT)) for g in GENERATED)
    )


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def comments_and_docstrings(path: Path) -> str:
    """The prose of one module: its `#` comments and every docstring, one block each."""
    text = path.read_text(encoding="utf-8")
    pieces = [
        tok.string for tok in tokenize.generate_tokens(io.StringIO(text).readline)
        if tok.type == tokenize.COMMENT
    ]
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                pieces.append(doc)
    return "\n".join(pieces)


MODULES = {module_name(p): p for p in sources()}
SUFFIXES: dict[str, list[str]] = defaultdict(list)
for _name in MODULES:
    _parts = _name.split(".")
    for _i in range(len(_parts)):
        SUFFIXES[".".join(_parts[_i:])].append(_name)
CLASSES: dict[str, list[str]] = defaultdict(list)
for _name, _path in MODULES.items():
    for _node in ast.walk(ast.parse(_path.read_text(encoding="utf-8"))):
        if isinstance(_node, ast.ClassDef):
            CLASSES[_node.name].append(_name)


BASENAMES = {p.name for top in ("rls", "lua", "scripts", "tests") for p in (ROOT / top).rglob("*")}


def bases(cited_in: Path) -> list[Path]:
    """Where a relative path may start: the root, rls/, docs/, and the citing file's packages."""
    found = [ROOT, RLS, ROOT / "docs"]
    here = cited_in.parent
    while here != ROOT and ROOT in here.parents:
        found.append(here)
        here = here.parent
    return found


def path_exists(ref: str, cited_in: Path) -> bool:
    if EXTERNAL.match(ref):
        return True
    return any((base / ref).exists() or (base / (ref + ".py")).exists()
               for base in bases(cited_in))


def module(name: str) -> ModuleType:
    return importlib.import_module(name)


def has_attribute(mod_name: str, chain: list[str]) -> bool:
    """`chain` names something on the module: an attribute, or one set on an instance."""
    obj: object = module(mod_name)
    for i, attr in enumerate(chain):
        if hasattr(obj, attr):
            obj = getattr(obj, attr)
            continue
        if i == 0:
            return False
        source = MODULES[mod_name].read_text(encoding="utf-8")
        return re.search(rf"self\.{attr}\b|^\s+{attr}\s*:|def {attr}\b", source, re.M) is not None
    return True


def dotted_resolves(ref: str) -> bool | None:
    """True/False when `ref` starts with an rls module or class; None when it is not ours."""
    parts = ref.split(".")
    known = False
    for cut in range(len(parts), 0, -1):
        head, rest = ".".join(parts[:cut]), parts[cut:]
        for mod_name in SUFFIXES.get(head, []):
            known = True
            if not rest or has_attribute(mod_name, rest):
                return True
    for mod_name in CLASSES.get(parts[0], []):
        known = True
        if has_attribute(mod_name, parts):
            return True
    # `deadline.reason`: an instance named after its class (`Deadline`).
    for cls, mod_names in CLASSES.items():
        if cls.lower() == parts[0].replace("_", "") and parts[0].islower():
            if any(has_attribute(m, [cls, *parts[1:]]) for m in mod_names):
                return True
    return False if known else None


def missing_in(text: str, cited_in: Path) -> list[str]:
    missing = [ref for ref in PATH.findall(text) if not path_exists(ref, cited_in)]
    missing += [ref for ref in BARE.findall(text)
                if not path_exists(ref, cited_in) and ref not in BASENAMES]
    missing += [ref for ref in RLS_DIR.findall(text) if not path_exists(ref, cited_in)]
    missing += [ref for ref in BACKTICKED_DIR.findall(text) if not path_exists(ref, cited_in)]
    for ref in DOTTED_RLS.findall(text):
        ref = ref.rstrip(".")
        if not ref.startswith(NOT_MODULES) and dotted_resolves(ref.removeprefix("rls.")) is False:
            missing.append(ref)
    for ref in BACKTICKED.findall(text) + PROSE.findall(text):
        if ref.startswith(NOT_MODULES) or FILE_NAME.search(ref):
            continue
        if dotted_resolves(ref) is False:
            missing.append(ref)
    where = cited_in.relative_to(ROOT)
    return [f"{where}: {ref}" for ref in dict.fromkeys(missing)]


def test_architecture_map_names_only_files_and_functions_that_exist() -> None:
    doc = ROOT / "docs" / "architecture.md"
    assert missing_in(doc.read_text(encoding="utf-8"), doc) == []


def test_comments_and_docstrings_name_only_files_and_functions_that_exist() -> None:
    missing = [m for path in sources() for m in missing_in(comments_and_docstrings(path), path)]
    assert missing == [], "\n".join(missing)


def test_the_scanner_catches_a_stale_name() -> None:
    """The patterns the real tests rely on do flag what is gone (so a pass means something)."""
    here = RLS / "stores" / "base.py"
    text = ("see limiter._merge_same_counter, rls/counters/stores.py, rls/counters/, "
            "`stores/redis.py`, rls.quota.limits, `local_cache.py`, `cache/`; but "
            "`limiter.RateLimiter`, `deadline.reason`, `stores/guard.py`, `redis/` are fine")
    assert [m.split(": ", 1)[1] for m in missing_in(text, here)] == [
        "rls/counters/stores.py", "stores/redis.py", "local_cache.py", "rls/counters/",
        "cache/", "rls.quota.limits", "limiter._merge_same_counter",
    ]
