"""docs/token-budgets.md shows the Envoy config the end-to-end tests run: its ratelimit filter
block is envoy/token-budget-reserve.yaml's filter (tests/e2e/test_envoy_token_budget_reserve.py),
and its rls YAML is the one that file's header documents."""

from __future__ import annotations

from typing import Any

import yaml
from support.rls_cli import ROOT

from .docblocks import blocks

DOC = "docs/token-budgets.md"


def shipped_filter() -> dict[str, Any]:
    config = yaml.safe_load((ROOT / "envoy" / "token-budget-reserve.yaml").read_text())
    hcm = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
    (found,) = [f for f in hcm["typed_config"]["http_filters"]
                if f["name"] == "envoy.filters.http.ratelimit"]
    return {k: v for k, v in found["typed_config"].items() if k != "@type"}


def doc_blocks(mark_value: str) -> list[Any]:
    return [yaml.safe_load(b.body) for b in blocks("yaml")
            if b.where.startswith(DOC) and b.mark_value == mark_value]


def test_the_documented_envoy_filter_is_the_tested_one() -> None:
    (documented,) = doc_blocks("envoy ratelimit filter")
    assert documented == shipped_filter()


def test_the_documented_rls_yaml_is_the_one_the_envoy_file_names() -> None:
    header = (ROOT / "envoy" / "token-budget-reserve.yaml").read_text().split("admin:")[0]
    after = header.split("# rls side (domain `llm`):\n", 1)[1]
    lines = [line[4:] for line in after.split("\n#\n", 1)[0].splitlines()]
    (documented,) = [d for d in doc_blocks("") if isinstance(d, dict) and "domain" in d]
    assert yaml.safe_load("\n".join(lines)) == documented
