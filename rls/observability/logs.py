"""Text or JSON logs on stderr; under `--workers` every line says which process wrote it."""

from __future__ import annotations

import json
import logging
import time

from rls.settings.environment import worker_index


class JsonFormatter(logging.Formatter):
    def __init__(self, worker: str | None = None) -> None:
        super().__init__()
        self.worker = worker

    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if self.worker is not None:
            out["worker"] = self.worker
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out)


def setup_logging(level: str, fmt: str, worker: str | None = None) -> None:
    """Root handler on stderr. `worker`: the process's label under --workers (`supervisor`, or
    the worker index read from RLS_WORKER_INDEX when not given), so interleaved lines of
    several processes can be told apart."""
    if worker is None:
        worker = worker_index()
    handler = logging.StreamHandler()
    if fmt == "json":
        handler.setFormatter(JsonFormatter(worker))
    else:
        tag = "" if worker is None else f"[worker {worker}] "
        handler.setFormatter(
            logging.Formatter(f"%(asctime)s %(levelname)s {tag}%(name)s: %(message)s")
        )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # watchfiles logs every batch of changes it sees at INFO. rls logs the config changes that
    # matter itself ("config change detected: <files>"); watchfiles' own line, for a log file
    # kept in the config directory, was a change of its own: a line every 100 ms, forever.
    logging.getLogger("watchfiles").setLevel(max(logging.WARNING, root.level))
    grpc_core = logging.getLogger(GRPC_AIO_LOGGER)
    grpc_core.filters[:] = [f for f in grpc_core.filters if not isinstance(f, LateAnswers)]
    grpc_core.addFilter(LateAnswers())


class LogGate:
    """At most `per_second` lines per second; the rest are counted (and reported with the next
    line), so a flood of bad requests or a dead store cannot fill the disk. The one throttle
    for repetitive log lines."""

    def __init__(self, per_second: int) -> None:
        self.per_second = per_second
        self._second = 0
        self._used = 0
        self._suppressed = 0

    def allow(self) -> bool:
        now = int(time.monotonic())
        if now != self._second:
            self._second, self._used = now, 0
        if self._used < self.per_second:
            self._used += 1
            return True
        self._suppressed += 1
        return False

    def take_suppressed(self) -> int:
        count, self._suppressed = self._suppressed, 0
        return count


GRPC_AIO_LOGGER = "grpc._cython.cygrpc"
LATE_ANSWER = "ExecuteBatchError raised in core by servicer method"


class LateAnswers(logging.Filter):
    """grpc.aio logs an ERROR with a traceback for every answer it could not send because the
    caller had gone (its deadline passed while a CPU-starved process finished the call): under
    load that is a multi-line traceback per late call. Here: one warning line a second at most,
    without the traceback, with the count of the others."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = LogGate(1)

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if not message.startswith(LATE_ANSWER):
            return True
        if not self.gate.allow():
            return False
        method = message[len(LATE_ANSWER):].strip(" []")
        others = self.gate.take_suppressed()
        record.msg = ("an answer of %s could not be sent: the caller had gone (its deadline "
                      "passed first)%s")
        record.args = (method or "a call", f"; {others} more since the last line" if others
                       else "")
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        record.exc_info = record.exc_text = None
        return True
