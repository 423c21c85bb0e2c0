"""Quota streams (RLQS) against hostile and careless clients (issue 24 item 1), on a real rls.

A client that never reads its answers is held back by flow control and then ended; bucket ids
are capped in bytes; a draining rls ends its streams at once. Bounds come from
docs/quota-mode.md "Limits of a stream"; the figures (loop stall, RSS) from
tests/quota/quota_load.py are in docs/reliability.md.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from envoy.service.rate_limit_quota.v3 import rlqs_pb2
from support.metrics import metric

from .quota_load import report

QUOTA = "/envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas"
CONFIG = """
domain: q
descriptors:
  - key: client
    rate_limit: {unit: hour, requests_per_unit: 50}
"""


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def wait_until(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "q.yaml"
    path.write_text(CONFIG)
    return path


def test_a_client_that_never_reads_answers_is_held_back_then_ended(rls_factory, config) -> None:
    rls = rls_factory(config, env={"RLS_QUOTA_STREAM_QUEUE_BYTES": "262144",
                                   "RLS_QUOTA_STALLED_S": "3"})
    before = rss_mb(rls.proc.pid)
    sent = 0
    offered = 200  # ~100 KB reports, ~260 KB answers each: 52 MB of answers if all were read

    def requests() -> Iterator[bytes]:
        nonlocal sent
        for i in range(offered):
            yield report([f"r{i}-{j:04}" for j in range(3000)])
            sent += 1

    channel = grpc.insecure_channel(rls.grpc_addr)
    answers = channel.stream_stream(QUOTA)(requests())  # not read until the end
    try:
        # rls stops reading once the answers queued for this stream pass their cap: the
        # reports it takes stop growing while the client still has plenty to send.
        wait_until(lambda: metric(rls.http_url, "rls_quota_queued_bytes") > 0, 30,
                   "answers queued for the non-reading client")
        taken = metric(rls.http_url, "rls_quota_reports_total")
        queued = metric(rls.http_url, "rls_quota_queued_bytes")
        assert taken < offered / 2, (taken, sent)
        # the cap plus at most the answer being built (one report's, ~260 KB)
        assert queued <= 262144 + 300_000, queued
        # The stalled stream is ended, its queue dropped; the client learns why when it reads.
        wait_until(lambda: metric(rls.http_url, "rls_quota_errors_total", reason="stalled") >= 1,
                   30, "the stalled stream ended")
        wait_until(lambda: metric(rls.http_url, "rls_quota_streams") == 0, 30,
                   "the stream closed")
        assert metric(rls.http_url, "rls_quota_queued_bytes") == 0
        assert rss_mb(rls.proc.pid) < before + 100
        with pytest.raises(grpc.RpcError) as err:
            for _ in answers:
                pass
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "RLS_QUOTA_STALLED_S" in (err.value.details() or "")
    finally:
        answers.cancel()
        channel.close()


def test_a_stalled_client_that_disconnects_without_reading_leaves_no_traceback(
    rls_factory, config
) -> None:
    """The stalled stream's RESOURCE_EXHAUSTED cannot go out while unread answers are ahead
    of it; when the client then goes away, sending the status fails. That failure used to
    reach gRPC as an ExecuteBatchError traceback in rls's log."""
    rls = rls_factory(config, env={"RLS_QUOTA_STREAM_QUEUE_BYTES": "262144",
                                   "RLS_QUOTA_STALLED_S": "1"})

    def requests() -> Iterator[bytes]:
        for i in range(200):
            yield report([f"r{i}-{j:04}" for j in range(3000)])

    channel = grpc.insecure_channel(rls.grpc_addr)
    answers = channel.stream_stream(QUOTA)(requests())  # never read
    try:
        wait_until(lambda: metric(rls.http_url, "rls_quota_errors_total", reason="stalled") >= 1,
                   30, "the stalled stream ended")
    finally:
        answers.cancel()
        channel.close()
    wait_until(lambda: "went away" in rls.log() or "Traceback" in rls.log(), 15,
               "the ended stream's status given up")
    assert "Traceback" not in rls.log(), rls.log()[-3000:]


def test_garbage_messages_are_counted_each_but_logged_once_per_stream(
    rls_factory, config
) -> None:
    """A client sending undecodable or domain-less messages as fast as it can used to write
    one log line per message (1,000 lines/s at 1,000 messages/s)."""
    rls = rls_factory(config)
    garbage = [b"\xff\xff\xff", b""] * 200  # undecodable; decodes but carries no domain
    channel = grpc.insecure_channel(rls.grpc_addr)
    call = channel.stream_stream(QUOTA)(iter([*garbage, report(["after"])]))
    try:
        answer = rlqs_pb2.RateLimitQuotaResponse.FromString(next(call))
        assert dict(answer.bucket_action[0].bucket_id.bucket) == {"client": "after"}
    finally:
        call.cancel()
        channel.close()
    assert metric(rls.http_url, "rls_quota_errors_total", reason="invalid") == 400
    log = rls.log()
    assert log.count("malformed RateLimitQuotaUsageReports ignored") == 1, log[-3000:]
    assert log.count("without a domain ignored") <= 1, log[-3000:]


def test_a_bucket_id_holding_2_mb_is_abandoned_and_nothing_is_kept(rls_factory, config) -> None:
    rls = rls_factory(config)
    before = rss_mb(rls.proc.pid)
    channel = grpc.insecure_channel(
        rls.grpc_addr, options=[("grpc.max_receive_message_length", 8 << 20)])
    try:
        call = channel.stream_stream(QUOTA)(
            iter([report([f"big{i}"], value_pad="v" * (2 << 20)) for i in range(20)]
                 + [report(["small"])])
        )
        seen = 0
        for data in call:
            for action in rlqs_pb2.RateLimitQuotaResponse.FromString(data).bucket_action:
                seen += 1
                if dict(action.bucket_id.bucket) == {"client": "small"}:
                    call.cancel()
                else:
                    assert action.HasField("abandon_action")
            if seen >= 22:
                break
        assert metric(rls.http_url, "rls_quota_errors_total", reason="bucket_id_size") == 20
        assert metric(rls.http_url, "rls_quota_buckets") <= 1  # only "small"
        assert rss_mb(rls.proc.pid) < before + 60
    finally:
        channel.close()
    assert "bucket id of" in rls.log() and "RLS_QUOTA_BUCKET_ID_BYTES" in rls.log()


def test_sigterm_ends_quota_streams_at_the_start_of_the_drain(rls_factory, config) -> None:
    rls = rls_factory(config, args=("--shutdown-delay-ms", "1000", "--drain-seconds", "5"))
    channel = grpc.insecure_channel(rls.grpc_addr)
    ended: list[tuple[float, grpc.StatusCode]] = []
    stop = threading.Event()

    def requests() -> Iterator[bytes]:
        yield report(["a"])
        stop.wait(30)

    call = channel.stream_stream(QUOTA)(requests())

    def read() -> None:
        try:
            for _ in call:
                pass
        except grpc.RpcError as exc:
            ended.append((time.monotonic(), exc.code()))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    wait_until(lambda: metric(rls.http_url, "rls_quota_assignments_total",
                              action="token_bucket") >= 1, 10, "the first grant")
    sent = time.monotonic()
    rls.proc.send_signal(signal.SIGTERM)
    reader.join(10)
    stop.set()
    channel.close()
    assert ended, "the quota stream outlived the drain"
    at, code = ended[0]
    assert code == grpc.StatusCode.UNAVAILABLE
    # Before the shutdown delay (1 s) and the grace (5 s): at the start of the drain.
    assert at - sent < 1.0, at - sent
    assert rls.proc.wait(15) == 0


async def test_a_report_of_2_to_the_64_requests_is_capped_and_the_bucket_keeps_being_dealt(
    memory_or_redis,
) -> None:
    """num_requests_allowed is a uint64: charged as sent, it pushed a Redis counter out of its
    integer range and the bucket answered the failure mode at every report until the window
    ended. Counts over 2^32 - 1 are capped (and counted as `invalid`)."""
    from quota.test_candidates import CONFIG as CANDIDATES
    from quota.test_candidates import counts, quota
    from quota.test_service import actions as answered
    from quota.test_service import report as usage

    stream, metrics, _ = quota(CANDIDATES, memory_or_redis)
    for allowed in (2**64 - 1, 2**63, 5):
        actions = await answered(stream, usage(({"client": "x"}, allowed, 2**64 - 1), elapsed=5))
        (deny, *_) = actions
        assert deny.quota_assignment_action.rate_limit_strategy.blanket_rule == 1  # DENY_ALL
        assert deny.quota_assignment_action.assignment_time_to_live.seconds > 6  # not failure
    assert stream.metrics.errors.labels("invalid")._value.get() == 3
    assert counts(metrics, "same")[0] == 5 * (2**32 - 1) + 5  # allowed + denied, capped
