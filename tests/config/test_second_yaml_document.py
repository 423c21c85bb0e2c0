"""A descriptor file with a second YAML document (`---` then another domain) loads only the
first, as the reference does; that used to be silent, so a domain pasted after `---` simply
did not exist. It is a located warning now (an error with --strict); a trailing `---` with
nothing after it is not."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.rls_cli import rls

pytestmark = pytest.mark.process

TWO = """domain: first
descriptors:
  - key: a
    rate_limit: {unit: minute, requests_per_unit: 1}
---
domain: second
descriptors:
  - key: b
    rate_limit: {unit: minute, requests_per_unit: 1}
"""


def test_second_document_is_a_warning_naming_its_line(tmp_path: Path) -> None:
    path = tmp_path / "two.yaml"
    path.write_text(TWO)
    done = rls("check-config", str(path), timeout=60)
    assert done.returncode == 0, done.stderr
    assert f"{path}: warning: a second YAML document (after ---) is ignored" in done.stderr
    assert f"(at {path}:5)" in done.stderr
    strict = rls("check-config", "--strict", str(path), timeout=60)
    assert strict.returncode == 1, strict.stderr


def test_trailing_document_marker_alone_is_no_warning(tmp_path: Path) -> None:
    path = tmp_path / "one.yaml"
    path.write_text(TWO.split("---")[0] + "---\n# nothing more\n")
    done = rls("check-config", "--strict", str(path), timeout=60)
    assert done.returncode == 0, done.stderr
    assert "warning" not in done.stderr
