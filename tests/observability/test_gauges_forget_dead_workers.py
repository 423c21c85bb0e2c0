"""Under --workers every gauge is read across processes (prometheus_client's multiprocess
mode). A worker that died (OOM-killed, crash-looped) must not keep speaking: a `max`/`min`/`all`
gauge keeps the dead process's last value, so a circuit open when it died, a store not ready,
an xDS stream "connected" or an old config version would show for the life of the pod. Only
the `live*` modes drop a process's values when the supervisor marks it dead."""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import ROOT


def gauge_calls() -> list[tuple[str, int, str | None]]:
    """(file, line, multiprocess_mode or None) of every Gauge(...) in rls/."""
    found = []
    for path in sorted((ROOT / "rls").rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id == "Gauge"):
                mode = next((kw.value.value for kw in node.keywords
                             if kw.arg == "multiprocess_mode"
                             and isinstance(kw.value, ast.Constant)), None)
                found.append((str(Path(path).relative_to(ROOT)), node.lineno, mode))
    return found


def test_every_gauge_drops_a_dead_workers_value() -> None:
    calls = gauge_calls()
    assert len(calls) > 10, calls  # the scan sees the gauges
    stale = [c for c in calls if not (c[2] or "").startswith("live")]
    assert not stale, f"gauges that keep a dead worker's value: {stale}"
