"""The certificate expiry metric under --workers: a worker that died before a rotation must not
keep showing the old certificate's expiry (prometheus multiprocess files of dead workers)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

OLD, NEW = 1_800_000_000.0, 1_900_000_000.0

WORKER = """
import os, sys
from prometheus_client import CollectorRegistry
from rls.grpc_access.tls import KeyMaterial, TlsMetrics
TlsMetrics(CollectorRegistry()).show(KeyMaterial(b"", b"", None, float(sys.argv[1]), None))
print(os.getpid())
"""


def _worker(directory: Path, expiry: float) -> int:
    """A worker process that showed `expiry` and exited; its pid."""
    done = subprocess.run(
        [sys.executable, "-c", WORKER, str(expiry)], capture_output=True, text=True, check=True,
        env={"PROMETHEUS_MULTIPROC_DIR": str(directory), "PATH": ""},
    )
    return int(done.stdout)


def test_a_dead_workers_old_certificate_expiry_is_not_shown_after_a_rotation(
    tmp_path: Path,
) -> None:
    dead = _worker(tmp_path, OLD)  # a worker that died before the rotation
    mark_process_dead(dead, str(tmp_path))  # what the supervisor does (rls/process/workers.py)
    _worker(tmp_path, NEW)  # the live worker, after the rotation (its file stays)
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(tmp_path))
    shown = {s.labels.get("certificate"): s.value for m in registry.collect() for s in m.samples
             if s.name == "rls_grpc_tls_certificate_expiry_timestamp_seconds"}
    assert shown == {"server": NEW}
