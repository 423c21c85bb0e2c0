"""Issue 18 item 4: the examples in README.md and docs/ run as printed, offline.

- every YAML block that is a descriptor file (a top-level `domain:`) or a cache rules file
  (top-level `rules:`) passes `rls check-config`;
- every shell line that runs `rls check-config …` or asks for `--help`/`--version` succeeds;
- no document refers readers to a DESIGN document they do not have.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml

from .helpers import ROOT, rls

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)


def blocks(kinds: tuple[str, ...]) -> list[tuple[str, str]]:
    found = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for m in FENCE.finditer(text):
            if m.group(1) in kinds:
                line = text[: m.start()].count("\n") + 1
                found.append((f"{doc.relative_to(ROOT)}:{line}", m.group(2)))
    return found


def config_blocks() -> list[tuple[str, str]]:
    out = []
    for where, body in blocks(("yaml", "yml")):
        try:
            doc = yaml.safe_load(body)
        except yaml.YAMLError:
            continue  # fragments (`...` elisions) are illustrations, not files
        if "..." in body or "…" in body:
            continue  # elided examples (`descriptors: [...]`) are illustrations, not files
        if isinstance(doc, dict) and ("domain" in doc or "rules" in doc):
            out.append((where, body))
    return out


def shell_lines() -> list[tuple[str, list[str]]]:
    out = []
    for where, body in blocks(("sh", "bash", "shell", "console", "")):
        for raw in body.splitlines():
            line = raw.strip().removeprefix("$ ").split(" #")[0].strip()
            if re.match(r"rls (check-config|.*--help$|--version$)", line) and "<" not in line:
                out.append((where, shlex.split(line)))
    return out


CONFIGS = config_blocks()
SHELL = shell_lines()


def test_the_docs_have_examples_to_run() -> None:
    assert len(CONFIGS) >= 2 and len(SHELL) >= 3, (len(CONFIGS), SHELL)


@pytest.mark.parametrize(("where", "body"), CONFIGS, ids=[w for w, _ in CONFIGS])
def test_yaml_example_passes_check_config(where: str, body: str, tmp_path: Path) -> None:
    path = tmp_path / "example.yaml"
    path.write_text(body)
    done = rls("check-config", str(path))
    assert done.returncode == 0, f"{where}:\n{body}\n{done.stderr}"


@pytest.mark.parametrize(("where", "argv"), SHELL, ids=[f"{w} {' '.join(a)}" for w, a in SHELL])
def test_shell_example_runs(where: str, argv: list[str]) -> None:
    done = rls(*argv[1:])
    assert done.returncode == 0, f"{where}: {' '.join(argv)}\n{done.stdout}{done.stderr}"


def test_no_reference_to_a_design_document() -> None:
    for doc in DOCS:
        assert "DESIGN" not in doc.read_text(encoding="utf-8"), doc
