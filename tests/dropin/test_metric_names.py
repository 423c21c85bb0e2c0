"""docs/metrics.md's recording rules give rls's per-limit counters the names and labels the
reference's default statsd-exporter mapper produces (`promtool test rules`, the real thing)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from support.system import require_binary

pytestmark = pytest.mark.process

ROOT = Path(__file__).resolve().parents[2]
PER_LIMIT = ("total_hits", "within_limit", "near_limit", "over_limit", "shadow_mode")


def documented_rules() -> str:
    doc = (ROOT / "docs" / "metrics.md").read_text()
    blocks = [b for b in re.findall(r"```yaml\n(.*?)```", doc, re.S)
              if "ratelimit-reference-names" in b]
    assert len(blocks) == 1, "one block of the reference-name recording rules"
    return blocks[0]


def test_recording_rules_rename_and_split_the_stats_key(tmp_path: Path) -> None:
    promtool = require_binary("promtool", "prometheus")
    (tmp_path / "rules.yaml").write_text(documented_rules())
    series, checks = [], []
    deep = 'domain="eg",key1="client_a",key2="path_x",key="eg.client_a.path_x"'
    shallow = 'domain="other",key1="user",key="other.user"'  # one level: no key2
    for n, stat in enumerate(PER_LIMIT, start=1):
        series.append(f"""      - series: 'rls_limit_{stat}_total{{key="eg.client_a.path_x"}}'
        values: '0 {n} {2 * n}'
      - series: 'rls_limit_{stat}_total{{key="other.user"}}'
        values: '1 1 1'""")
        checks.append(f"""      - expr: ratelimit_service_rate_limit_{stat}
        eval_time: 2m
        exp_samples:
          - labels: 'ratelimit_service_rate_limit_{stat}{{{deep}}}'
            value: {2 * n}
          - labels: 'ratelimit_service_rate_limit_{stat}{{{shallow}}}'
            value: 1""")
    nl = "\n"
    (tmp_path / "test.yaml").write_text(f"""rule_files: [rules.yaml]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
{nl.join(series)}
      - series: 'rls_config_loads_total{{result="success"}}'
        values: '1 1 2'
      - series: 'rls_config_loads_total{{result="error"}}'
        values: '0 1 1'
    promql_expr_test:
{nl.join(checks)}
      - expr: ratelimit_service_config_load_success
        eval_time: 2m
        exp_samples:
          - labels: 'ratelimit_service_config_load_success{{result="success"}}'
            value: 2
      - expr: ratelimit_service_config_load_error
        eval_time: 2m
        exp_samples:
          - labels: 'ratelimit_service_config_load_error{{result="error"}}'
            value: 1
""")
    done = subprocess.run([promtool, "test", "rules", "test.yaml"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
