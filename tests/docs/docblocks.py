"""The fenced blocks of README.md and docs/*.md, with the marker that says how to check them.

A block is checked as what it is (a descriptor file, a cache rules file, a counters config,
shell commands) unless the line right before its fence (blank lines aside) marks it:

- `<!-- fragment: CONTEXT -->` (or a first YAML line `# fragment: CONTEXT`): a piece of a
  larger file, checked inside CONTEXT (see FRAGMENT_CONTEXTS in test_docs_examples.py);
- `<!-- needs: WHAT[, WHAT] -->`: commands that need what the docs tests do not start
  (`envoy`, `kubernetes`, `ssdb`, `grpcurl`, `a traffic log`, `a terminal`), named so a
  reader knows.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from support.rls_cli import ROOT

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
MARK = re.compile(r"<!--\s*(fragment|needs):\s*(.*?)\s*-->")
FIRST_LINE_MARK = re.compile(r"^#\s*(fragment):\s*(.*?)\s*$")


@dataclass(frozen=True)
class Block:
    where: str  # `docs/admin.md:102`
    lang: str
    body: str
    mark: str | None  # "fragment" | "needs" | None
    mark_value: str  # the context, or what it needs

    @property
    def needs(self) -> list[str]:
        return [n.strip() for n in self.mark_value.split(",")] if self.mark == "needs" else []


def _mark_before(text: str, start: int) -> tuple[str | None, str]:
    before = text[:start].rstrip("\n").rsplit("\n", 1)[-1].strip()
    found = MARK.fullmatch(before)
    return (found.group(1), found.group(2)) if found else (None, "")


def blocks(*langs: str) -> list[Block]:
    out = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for m in FENCE.finditer(text):
            if m.group(1) not in langs:
                continue
            line = text[: m.start()].count("\n") + 1
            mark, value = _mark_before(text, m.start())
            first = FIRST_LINE_MARK.match(m.group(2).split("\n", 1)[0])
            if mark is None and first:
                mark, value = first.group(1), first.group(2)
            out.append(Block(f"{doc.relative_to(ROOT)}:{line}", m.group(1), m.group(2), mark,
                             value))
    return out
