"""The RLQS stream's answers per bucket kind, driven without Envoy (memory store, real protos)."""

from __future__ import annotations

import asyncio

from envoy.service.rate_limit_quota.v3 import rlqs_pb2
from prometheus_client import CollectorRegistry
from support.stores import RemoteStore

from rls.config.loader import load_files
from rls.core.model import Check
from rls.quota.actions import ALLOW_ALL, DENY_ALL, FAILURE_TTL_S, TOKENS_TTL_S
from rls.quota.bounds import SLICE_BUCKETS, QuotaBounds
from rls.quota.share import Dealer
from rls.services.quota import STORE_TIMEOUT_MS, QuotaService, QuotaStream
from rls.settings import Settings
from rls.stores.base import BackendError
from rls.stores.memory import MemoryBackend

from .test_share import Clock

CONFIG = """
domain: q
descriptors:
  - key: client
    rate_limit: {unit: second, unit_multiplier: 5, requests_per_unit: 4}
  - key: free
    rate_limit: {unlimited: true}
  - key: smooth
    rate_limit: {unit: second, requests_per_unit: 4, algorithm: token_bucket}
  - key: rolling
    rate_limit: {unit: minute, requests_per_unit: 4, window: rolling_from_first_hit}
"""


def service(
    backend=None, failure_mode: str = "allow", unmatched: str = "allow", **limits
) -> QuotaService:
    """A quota service on `backend`, or on a memory store whose clock (and the dealer's) stands
    still at the start of a window: a test's reports never straddle a window's end."""
    config = load_files([("q.yaml", CONFIG)])
    settings = Settings(failure_mode=failure_mode)
    dealer = None
    if backend is None:
        clock = Clock()
        backend = MemoryBackend(clock=clock, sweep_interval=0)
        dealer = Dealer(backend, STORE_TIMEOUT_MS, clock)
    return QuotaService(lambda: config, backend, settings, CollectorRegistry(),
                        unmatched=unmatched, dealer=dealer, limits=QuotaBounds(**limits))


def report(*buckets: tuple[dict[str, str], int, int], elapsed: int = 0):
    message = rlqs_pb2.RateLimitQuotaUsageReports(domain="q")
    for bucket, allowed, denied in buckets:
        usage = message.bucket_quota_usages.add()
        usage.bucket_id.bucket.update(bucket)
        usage.num_requests_allowed = allowed
        usage.num_requests_denied = denied
        usage.time_elapsed.seconds = elapsed
    return message


async def actions(stream: QuotaStream, message) -> list:
    """The actions of the stream's one answer to `message`."""
    await stream.handle(message)
    data = stream._out.popleft()
    assert not stream._out
    return list(rlqs_pb2.RateLimitQuotaResponse.FromString(data).bucket_action)


def answer(stream: QuotaStream, message) -> list:
    return asyncio.run(actions(stream, message))


def test_new_limited_bucket_gets_a_blanket_rule_then_a_full_token_bucket_at_once() -> None:
    stream = QuotaStream(service().context)
    first, second = answer(stream, report(({"client": "a"}, 1, 0)))
    assert first.quota_assignment_action.rate_limit_strategy.blanket_rule == DENY_ALL
    tb = second.quota_assignment_action.rate_limit_strategy.token_bucket
    assert tb.max_tokens == 3  # 4 per window, 1 already admitted before the answer
    assert tb.fill_interval.seconds > TOKENS_TTL_S  # no refill while the grant lives
    assert second.quota_assignment_action.assignment_time_to_live.seconds == TOKENS_TTL_S
    assert dict(second.bucket_id.bucket) == {"client": "a"}


def test_a_report_naming_another_domain_on_the_same_stream_is_ignored() -> None:
    """A stream's buckets are matched under its first domain and kept (charged, left to the
    next stream) under the stream's domain: a report switching domains was answered and
    charged under the first domain's limits while the stream took the new domain's name."""
    stream = QuotaStream(service().context)
    answer(stream, report(({"client": "a"}, 1, 0)))
    other = report(({"client": "a"}, 1, 0))
    other.domain = "elsewhere"
    asyncio.run(stream.handle(other))
    assert not stream._out
    assert stream.domain == "q"
    assert stream.metrics.errors.labels("invalid")._value.get() == 1


def test_a_counter_the_store_lost_is_not_dealt_beyond_the_limit() -> None:
    """A counter gone from the store (Redis restarted without its data, flushed, or evicted
    by --memory-max-bytes) took the stream's reservation with it; counted as still held, it
    was dealt again on top of the fresh room: 4 per window granted 6 at once (17 for 10/min
    on a Redis that was flushed)."""
    svc = service()
    stream = QuotaStream(svc.context)
    answer(stream, report(({"client": "a"}, 1, 0)))  # 3 tokens reserved
    svc.dealer.backend._data.clear()  # type: ignore[attr-defined]
    *_, action = answer(stream, report(({"client": "a"}, 1, 20), elapsed=5))
    # The window's count is gone (as for ShouldRateLimit); the grant is at most the limit.
    assert action.quota_assignment_action.rate_limit_strategy.token_bucket.max_tokens <= 4


def test_spent_bucket_is_denied_until_the_window_resets() -> None:
    stream = QuotaStream(service().context)
    (action,) = answer(stream, report(({"client": "a"}, 4, 0)))
    assign = action.quota_assignment_action
    assert assign.rate_limit_strategy.blanket_rule == DENY_ALL
    assert assign.assignment_time_to_live.seconds >= TOKENS_TTL_S


def test_unlimited_bucket_gets_allow_all() -> None:
    (action,) = answer(QuotaStream(service().context), report(({"free": "x"}, 1, 0)))
    assert action.quota_assignment_action.rate_limit_strategy.blanket_rule == ALLOW_ALL
    assert action.quota_assignment_action.assignment_time_to_live.seconds > 5


def test_unmatched_bucket_gets_the_configured_default() -> None:
    (allow,) = answer(QuotaStream(service().context), report(({"other": "x"}, 1, 0)))
    assert allow.quota_assignment_action.rate_limit_strategy.blanket_rule == ALLOW_ALL
    (deny,) = answer(QuotaStream(service(unmatched="deny").context), report(({"other": "x"}, 1, 0)))
    assert deny.quota_assignment_action.rate_limit_strategy.blanket_rule == DENY_ALL


def test_limit_with_an_algorithm_quota_mode_cannot_deal_is_unmatched_and_logged(caplog) -> None:
    svc = service()
    (action,) = answer(QuotaStream(svc.context), report(({"smooth": "x"}, 1, 0)))
    assert action.quota_assignment_action.rate_limit_strategy.blanket_rule == ALLOW_ALL
    assert "token_bucket" in caplog.text and "q.smooth" in caplog.text


def test_rolling_window_limit_is_unmatched_and_logged(caplog) -> None:
    """Reservations are charges: dealt, a rolling window would start at the first grant."""
    (action,) = answer(QuotaStream(service().context), report(({"rolling": "x"}, 1, 0)))
    assert action.quota_assignment_action.rate_limit_strategy.blanket_rule == ALLOW_ALL
    assert "rolling_from_first_hit" in caplog.text and "q.rolling" in caplog.text


class DeadStore(RemoteStore):
    async def decide(self, checks, now_ms=None, usage=(), usage_ttl_ms=0, deadline=None):
        raise BackendError("redis: connection refused")


def test_dead_store_follows_the_failure_mode_with_short_assignments() -> None:
    for mode, rule in (("allow", ALLOW_ALL), ("deny", DENY_ALL)):
        svc = service(DeadStore(sweep_interval=0), failure_mode=mode)
        (action,) = answer(QuotaStream(svc.context), report(({"client": "a"}, 1, 0)))
        assign = action.quota_assignment_action
        assert assign.rate_limit_strategy.blanket_rule == rule
        assert assign.assignment_time_to_live.seconds == FAILURE_TTL_S
        assert svc.metrics.errors.labels("backend")._value.get() == 1


def test_with_limiting_switched_off_a_dead_store_allows_as_for_should_rate_limit() -> None:
    """One failure rule (rls.engine.rules.fails_open) for both services."""
    svc = service(DeadStore(sweep_interval=0), failure_mode="deny")
    svc.context.settings.limiting_off = True
    (action,) = answer(QuotaStream(svc.context), report(({"client": "a"}, 1, 0)))
    assert action.quota_assignment_action.rate_limit_strategy.blanket_rule == ALLOW_ALL


def test_every_bucket_of_a_report_is_answered_in_one_response() -> None:
    actions = answer(QuotaStream(service().context), report(
        ({"client": "a"}, 0, 0), ({"client": "b"}, 0, 0), ({"free": "x"}, 0, 0)
    ))
    assert len(actions) == 2 + 2 + 1


def test_thousands_of_buckets_in_one_report_are_all_answered_in_bounded_messages() -> None:
    svc = service()
    stream = QuotaStream(svc.context)
    asyncio.run(stream.handle(report(*(({"client": f"c{i}"}, 1, 0) for i in range(3000)))))
    messages = []
    while stream._out:
        messages.append(rlqs_pb2.RateLimitQuotaResponse.FromString(stream._out.popleft()))
    assert len(messages) == 3
    actions = [a for m in messages for a in m.bucket_action]
    assert len(actions) == 2 * 3000
    for m in messages:  # a bucket's blanket rule and token bucket stay in one message
        assert len(m.bucket_action) % 2 == 0
        assert all(m.bucket_action[i].bucket_id == m.bucket_action[i + 1].bucket_id
                   for i in range(0, len(m.bucket_action), 2))
    assert svc.metrics.buckets._value.get() == 3000


def test_buckets_beyond_the_per_stream_cap_get_the_failure_rule_without_state(
    monkeypatch,
) -> None:
    import rls.quota.table as table

    monkeypatch.setattr(table, "MAX_BUCKETS_PER_STREAM", 2)
    svc = service(failure_mode="deny")
    stream = QuotaStream(svc.context)
    actions = answer(stream, report(*(({"client": f"c{i}"}, 0, 0) for i in range(3))))
    assert len(stream.buckets) == 2
    (capped,) = [a for a in actions if dict(a.bucket_id.bucket) == {"client": "c2"}]
    last = capped.quota_assignment_action
    assert last.rate_limit_strategy.blanket_rule == DENY_ALL
    assert last.assignment_time_to_live.seconds == FAILURE_TTL_S
    assert svc.metrics.errors.labels("bucket_cap")._value.get() == 1


class Client:
    """Drives QuotaStream.run like gRPC would: reports in, answers collected."""

    def __init__(self, svc: QuotaService) -> None:
        self.svc = svc
        self.stream = QuotaStream(svc.context)
        self.inbox: asyncio.Queue = asyncio.Queue()
        self.answers: list = []
        self.got = asyncio.Event()
        self.task = asyncio.get_running_loop().create_task(self._run())

    async def _requests(self):
        while True:
            message = await self.inbox.get()
            if message is None:
                return
            yield message.SerializeToString()

    async def _write(self, data: bytes) -> None:
        self.answers.append(rlqs_pb2.RateLimitQuotaResponse.FromString(data))
        self.got.set()

    async def _run(self):
        self.svc.streams.add(self.stream)
        try:
            return await self.stream.run(self._requests(), self._write)
        finally:
            self.svc.streams.discard(self.stream)
            await self.stream.close()

    async def ask(self, message) -> list:
        self.got.clear()
        before = len(self.answers)
        await self.inbox.put(message)
        async with asyncio.timeout(5):
            while len(self.answers) == before:
                await self.got.wait()
                self.got.clear()
        return [a for m in self.answers[before:] for a in m.bucket_action]

    async def close(self):
        await self.inbox.put(None)
        async with asyncio.timeout(5):
            return await self.task


def tokens(actions) -> int:
    return sum(a.quota_assignment_action.rate_limit_strategy.token_bucket.max_tokens
               for a in actions)


async def eventually(condition, what: str, timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.01)


def test_idle_buckets_expire_on_a_timer_and_give_their_reservation_back(monkeypatch) -> None:
    import rls.quota.table as table

    monkeypatch.setattr(table, "FORGET_AFTER_MS", 200)

    async def main() -> None:
        svc = service(MemoryBackend(sweep_interval=0))  # the wall clock: idleness must pass
        client = Client(svc)
        assert tokens(await client.ask(report(({"client": "a"}, 0, 0)))) == 4
        assert svc.dealer.peers(client.stream.buckets[(("client", "a"),)].ledgers[0].key) == 1
        # No further report: the timer alone forgets the bucket and releases its 4 tokens.
        await eventually(lambda: not client.stream.buckets, "the idle bucket forgotten")
        assert svc.metrics.buckets._value.get() == 0
        await eventually(lambda: not svc.background, "the release done")
        assert tokens(await client.ask(report(({"client": "b"}, 0, 0)))) == 4
        await client.close()

    asyncio.run(main())


def test_a_report_of_thousands_of_buckets_yields_the_loop_between_slices() -> None:
    async def main() -> None:
        svc = service()
        stream = QuotaStream(svc.context)
        ticks = 0
        done = False

        async def ticker() -> None:
            nonlocal ticks
            while not done:
                ticks += 1
                await asyncio.sleep(0)

        task = asyncio.get_running_loop().create_task(ticker())
        await asyncio.sleep(0)
        start = ticks
        await stream.handle(report(*(({"client": f"c{i}"}, 1, 0) for i in range(3000))))
        done = True
        await task
        # Another task ran between every slice of at most SLICE_BUCKETS buckets.
        assert ticks - start >= 3000 // SLICE_BUCKETS

    asyncio.run(main())


def test_a_bucket_id_over_the_byte_cap_is_abandoned_and_nothing_is_kept() -> None:
    async def main() -> None:
        svc = service(bucket_id_bytes=100)
        client = Client(svc)
        actions = await client.ask(report(({"client": "x" * 200}, 1, 0), ({"client": "a"}, 0, 0)))
        big = [a for a in actions if dict(a.bucket_id.bucket) == {"client": "x" * 200}]
        assert len(big) == 1 and big[0].HasField("abandon_action")
        assert list(client.stream.buckets) == [(("client", "a"),)]
        assert svc.metrics.errors.labels("bucket_id_size")._value.get() == 1
        await client.close()

    asyncio.run(main())


def test_new_buckets_beyond_the_byte_caps_get_the_failure_rule_without_state() -> None:
    async def main() -> None:
        svc = service(failure_mode="deny", stream_bucket_bytes=40)
        client = Client(svc)
        actions = await client.ask(report(*(({"client": f"c{i}"}, 0, 0) for i in range(4))))
        kept = len(client.stream.buckets)
        assert 1 <= kept < 4
        assert client.stream.id_bytes <= 40 and svc.bucket_bytes == client.stream.id_bytes
        denied = [a for a in actions if a.quota_assignment_action.assignment_time_to_live.seconds
                  == FAILURE_TTL_S]
        assert len(denied) == 4 - kept
        assert svc.metrics.errors.labels("bucket_cap")._value.get() == 4 - kept
        await client.close()
        # What the ended stream left for its successor is still counted, nothing more.
        assert svc.bucket_bytes == sum(b.id_bytes for b in svc.orphans.buckets()) > 0

    asyncio.run(main())


def test_the_next_stream_of_a_bucket_gets_the_ended_streams_grant_back() -> None:
    async def main() -> None:
        svc = service()
        first = Client(svc)
        assert tokens(await first.ask(report(({"client": "a"}, 0, 0)))) == 4
        await first.close()  # the stream ends right after its grant, nothing admitted
        assert svc.metrics.streams._value.get() == 0
        second = Client(svc)  # Envoy reconnects and reports 0 used (5 s since its report)
        actions = await second.ask(report(({"client": "a"}, 0, 0), elapsed=5))
        assert tokens(actions) >= 1  # not DENY_ALL for the rest of the window
        # and the whole limit is dealable again as soon as demand shows.
        assert tokens(await second.ask(report(({"client": "a"}, 0, 4), elapsed=5))) == 4
        await second.close()

    asyncio.run(main())


def test_an_ended_streams_grant_nobody_adopts_is_released_after_the_adopt_time() -> None:
    async def main() -> None:
        svc = service(adopt_s=0.1)
        first = Client(svc)
        assert tokens(await first.ask(report(({"client": "a"}, 1, 0)))) == 3
        await first.close()
        assert svc.orphans
        await eventually(lambda: not svc.orphans and not svc.background, "orphans released")
        # The 3 reserved tokens are back in the counter: 4 - 1 admitted.
        second = Client(svc)
        assert tokens(await second.ask(report(({"client": "b"}, 0, 0)))) == 4
        assert tokens(await second.ask(report(({"client": "a"}, 0, 0)))) == 3
        await second.close()

    asyncio.run(main())


def test_draining_ends_every_stream_gives_reservations_back_and_refuses_new_ones() -> None:
    async def main() -> None:
        svc = service()
        client = Client(svc)
        assert tokens(await client.ask(report(({"client": "a"}, 0, 0)))) == 4
        async with asyncio.timeout(5):
            await svc.drain()
        status = await client.task
        assert status is not None and status[0].name == "UNAVAILABLE"
        # Its last answer renews the token bucket Envoy holds, unchanged and alone (no blanket
        # rule before it): Envoy keeps its remaining tokens, and their TTL restarts.
        (renewed,) = client.answers[-1].bucket_action
        bucket = renewed.quota_assignment_action.rate_limit_strategy.token_bucket
        assert bucket.max_tokens == 4 and dict(renewed.bucket_id.bucket) == {"client": "a"}
        assert not svc.orphans and svc.outboxes.bytes == 0
        # Everything given back: a ShouldRateLimit-side check finds the whole limit.
        dom = svc.context.config().domains["q"]
        from rls.engine.checks import match_targets

        ((limit, key, _, _),) = match_targets(dom, "q", (("client", "a"),), "rl:")
        verdict = svc.dealer.backend.decide_now([Check(0, limit, key, 0)], charge=False)
        assert verdict.outcomes[0].used == 0

    asyncio.run(main())


def test_a_bucket_held_costs_the_garbage_collector_three_objects() -> None:
    """A full collection walks every tracked object: with 20,000 buckets, each one more per
    bucket is ~20,000 more to walk while every caller waits (docs/reliability.md)."""
    import gc

    async def main() -> None:
        svc = service()
        stream = QuotaStream(svc.context)
        # A first report pays what is made once (caches, series, the loop's own objects), so
        # the count below is what the buckets themselves cost.
        await stream.handle(report(*(({"client": f"w{i}"}, 1, 0) for i in range(200))))
        stream._out.drop()
        gc.collect()
        before = len(gc.get_objects())
        await stream.handle(report(*(({"client": f"c{i}"}, 1, 0) for i in range(5000))))
        stream._out.drop()
        gc.collect()
        assert len(stream.buckets) == 5200
        per_bucket = (len(gc.get_objects()) - before) / 5000
        assert per_bucket <= 3.1, per_bucket  # bucket, its ledger list, ledger

    asyncio.run(main())
