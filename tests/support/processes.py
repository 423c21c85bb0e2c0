"""Child processes the tests start (redis-server, rls, Envoy, Prometheus, SSDB)."""

from __future__ import annotations

import subprocess


def stop_process(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> int:
    """SIGTERM, wait up to `timeout`, then SIGKILL; the exit code. Idempotent."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode
