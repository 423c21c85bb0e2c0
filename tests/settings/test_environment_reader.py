"""Every read of the process environment is in rls/settings/environment.py, so what a deployment
can set is found in one place (the settings' variables, and the accessors beside them for what
libraries or the supervisor read); a module that needs a variable asks it."""

from __future__ import annotations

import ast

from conftest import ROOT

READER = ROOT / "rls" / "settings" / "environment.py"


def environment_reads() -> list[str]:
    """`file:line` of every os.environ / os.getenv / os.environb outside the reader."""
    found = []
    for path in sorted((ROOT / "rls").rglob("*.py")):
        if path == READER:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv", "environb")
                    and isinstance(node.value, ast.Name) and node.value.id == "os"):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_only_settings_reads_the_environment() -> None:
    assert not environment_reads()


def test_the_scan_finds_the_readers_it_guards_against() -> None:
    tree = ast.parse(READER.read_text())
    reads = [n for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "environ"]
    assert len(reads) > 5  # the reader itself goes through os.environ: the scan sees it
