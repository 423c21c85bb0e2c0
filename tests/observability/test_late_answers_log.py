"""grpc.aio's ERROR traceback for an answer it could not send (the caller had gone) becomes at
most one warning line a second, with a count, once rls's logging is set up."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import pytest

from rls.observability.logs import GRPC_AIO_LOGGER, setup_logging


@pytest.fixture
def stderr_log(monkeypatch: pytest.MonkeyPatch) -> Iterator[io.StringIO]:
    out = io.StringIO()
    monkeypatch.setattr("sys.stderr", out)
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    setup_logging("info", "text")
    yield out
    root.handlers[:], level = saved
    root.setLevel(level)
    logging.getLogger(GRPC_AIO_LOGGER).filters.clear()


def grpc_logs_a_late_answer() -> None:
    """What grpc.aio's server does (server.pyx.pxi, _handle_exceptions)."""
    try:
        raise RuntimeError('Failed "execute_batch": (<SendStatusFromServerOperation>)')
    except RuntimeError:
        logging.getLogger(GRPC_AIO_LOGGER).exception(
            "ExecuteBatchError raised in core by servicer method [%s]",
            "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
        )


def test_a_burst_of_late_answers_is_one_warning_line_without_a_traceback(stderr_log):
    for _ in range(50):
        grpc_logs_a_late_answer()
    lines = stderr_log.getvalue().splitlines()
    assert 1 <= len(lines) <= 2, lines  # one a second (the burst may straddle a second)
    assert "WARNING grpc._cython.cygrpc: an answer of /envoy.service.ratelimit.v3." in lines[0]
    assert "the caller had gone" in lines[0] and "Traceback" not in stderr_log.getvalue()


def test_other_grpc_errors_pass_unchanged(stderr_log):
    logging.getLogger(GRPC_AIO_LOGGER).error("Unexpected [ValueError] raised by servicer")
    assert "ERROR grpc._cython.cygrpc: Unexpected [ValueError]" in stderr_log.getvalue()
