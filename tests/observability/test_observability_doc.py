"""docs/observability.md stays in step with the dashboard and the rules it documents."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from .prom import DASHBOARD_FILE, RULES_FILE

DOCS = Path(__file__).resolve().parents[2] / "docs"
DOC = (DOCS / "observability.md").read_text(encoding="utf-8")


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def test_every_alert_has_a_runbook_section_its_annotation_points_to():
    anchors = {_anchor(h) for h in re.findall(r"^#+ (.+)$", DOC, flags=re.M)}
    groups = yaml.safe_load(RULES_FILE.read_text())["groups"]
    for rule in (r for g in groups for r in g["rules"]):
        runbook = rule["annotations"]["runbook"]
        assert runbook == f"docs/observability.md#{rule['alert'].lower()}", rule["alert"]
        assert rule["alert"].lower() in anchors, f"no runbook section for {rule['alert']}"
        section = DOC.split(f"### {rule['alert']}\n", 1)[1].split("\n#", 1)[0]
        assert "Runbook:" in section, rule["alert"]


def test_every_dashboard_panel_is_explained():
    dashboard = json.loads(DASHBOARD_FILE.read_text())
    titles = [p["title"] for p in dashboard["panels"] if p["type"] != "row"]
    missing = [t for t in titles if f"| {t} |" not in DOC]
    assert not missing, f"panels missing from docs/observability.md: {missing}"


def test_relative_links_and_anchors_resolve():
    anchors = {_anchor(h) for h in re.findall(r"^#+ (.+)$", DOC, flags=re.M)}
    for target, anchor in re.findall(r"\]\(([^)#\s]*)(?:#([^)]*))?\)", DOC):
        if "://" in target:
            continue
        if target:
            assert (DOCS / target).resolve().exists(), f"broken link {target}"
        elif anchor:
            assert anchor in anchors, f"broken anchor #{anchor}"
