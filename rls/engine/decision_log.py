"""The decision log (`--decision-log PATH`): a sampled JSON line per decision, for `rls replay`.

Off by default. When on, a decision costs the request path one sampling test and, when
sampled, one non-blocking put of a tuple into a bounded queue: the JSON is built and written
by a logging QueueListener thread into a RotatingFileHandler (the file and one backup, each up
to `--decision-log-max-bytes`). A full queue (the disk slower than the traffic) drops lines
and counts them in `dropped`; it never slows a decision.

Sampling is per caller, not per call: a request is logged when the hash of its domain and
descriptors falls in the `--decision-log-sample` fraction, so a sampled caller has every one
of its requests in the log and replaying it counts its counters exactly (a limit shared by
several callers, e.g. a per-route total, sees only the sampled callers' part).

A line (the timestamp first, so the replay reader can take it without a JSON parse):

    {"ts":1767225600123,"code":"OK","domain":"gateway","hits":0,
     "descriptors":[{"entries":[["user","alice"]]},{"entries":[["api","x"]],"hits":3}]}

`ts`: the decision's time in ms since the epoch; `code`: OK or OVER_LIMIT as answered;
`hits`: the request's hits_addend; per descriptor its entries, and `hits` / `negative` when
the descriptor set its own hits_addend / is_negative_hits.
"""

from __future__ import annotations

import json
import logging
import logging.handlers
import os
import queue
import time
import zlib
from collections.abc import Sequence
from typing import Any

from rls.engine.decision import DescriptorIn

log = logging.getLogger("rls.decision_log")

QUEUE_MAX = 10_000  # lines waiting for the writer thread


def line(ts_ms: int, code: str, domain: str, descriptors: Sequence[DescriptorIn],
         hits: int) -> str:
    """One decision as a log line (without the newline): the format `rls replay` reads."""
    descs: list[dict[str, Any]] = []
    for d in descriptors:
        item: dict[str, Any] = {"entries": [list(e) for e in d.entries]}
        if d.hits is not None:
            item["hits"] = d.hits
        if d.negative:
            item["negative"] = True
        descs.append(item)
    rest = json.dumps(
        {"domain": domain, "hits": hits, "descriptors": descs},
        separators=(",", ":"), ensure_ascii=False,
    )
    return f'{{"ts":{ts_ms},"code":"{code}",{rest[1:]}'


class _Formatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return line(*record.args)  # type: ignore[misc]


class _BoundedQueueHandler(logging.handlers.QueueHandler):
    """Drops (and counts) a record when the queue is full instead of blocking or raising."""

    dropped = 0

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        return record  # formatted in the listener's thread, not on the request path

    def enqueue(self, record: logging.LogRecord) -> None:
        try:
            self.queue.put_nowait(record)
        except queue.Full:
            self.dropped += 1


class DecisionLog:
    def __init__(self, path: str, sample: float, max_bytes: int) -> None:
        self.path = path
        self._threshold = int(sample * 2**32)  # crc32 below this: sampled
        self._all = sample >= 1.0
        file_handler = logging.handlers.RotatingFileHandler(
            path, maxBytes=max_bytes, backupCount=1, encoding="utf-8", delay=True
        )
        file_handler.setFormatter(_Formatter())
        self._queue: queue.Queue[logging.LogRecord] = queue.Queue(QUEUE_MAX)
        self._handler = _BoundedQueueHandler(self._queue)
        self._listener = logging.handlers.QueueListener(self._queue, file_handler)
        self._listener.start()
        # Said once at start: where the lines go (a relative path is the process's cwd).
        log.info("decision log: writing to %s (%g%% of callers; rotates at %d bytes, one "
                 "backup kept)", os.path.abspath(path), min(sample, 1.0) * 100, max_bytes)

    @property
    def dropped(self) -> int:
        return self._handler.dropped

    def sampled(self, domain: str, descriptors: Sequence[DescriptorIn]) -> bool:
        if self._all:
            return True
        text = domain + "|" + "|".join(f"{k}={v}" for d in descriptors for k, v in d.entries)
        return zlib.crc32(text.encode()) < self._threshold

    def record(
        self, domain: str, descriptors: Sequence[DescriptorIn], hits: int, code: str,
        now_ms: int | None = None,
    ) -> None:
        """Queue one decision (when its caller is sampled); never blocks."""
        if not self.sampled(domain, descriptors):
            return
        ts = now_ms if now_ms is not None else int(time.time() * 1000)
        record = logging.LogRecord(
            "rls.decisions", logging.INFO, "", 0, "", (ts, code, domain, descriptors, hits), None
        )
        self._handler.enqueue(record)

    def close(self) -> None:
        """Write what is queued and close the file."""
        self._listener.stop()
        for handler in self._listener.handlers:
            handler.close()
