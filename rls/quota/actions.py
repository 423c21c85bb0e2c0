"""The answers of an RLQS stream: bucket actions, and the messages that carry them.

Facts about Envoy 1.40 these follow (measured against it; docs/quota-mode.md): TTLs and fill
intervals are whole seconds (below 1 s: expired at once / unlimited); an identical token
bucket keeps its remaining tokens, a changed one carries the old fill ratio over unless a
blanket rule comes first.
"""

from __future__ import annotations

from collections.abc import Callable

from envoy.service.rate_limit_quota.v3 import rlqs_pb2
from envoy.type.v3 import ratelimit_strategy_pb2

# Whole seconds (Envoy truncates), each longer than the 5 s report cadence.
TOKENS_TTL_S = 12  # a grant outlives one lost report
ALLOW_TTL_S = 60  # unlimited / unmatched: nothing to re-deal
FAILURE_TTL_S = 6  # store down: until just after the next report, which retries
RESPONSE_ACTIONS = 2_000  # per response message (~150 KB), whatever the report's size

ALLOW_ALL = ratelimit_strategy_pb2.RateLimitStrategy.ALLOW_ALL
DENY_ALL = ratelimit_strategy_pb2.RateLimitStrategy.DENY_ALL

Action = rlqs_pb2.RateLimitQuotaResponse.BucketAction


def blanket(
    bucket_id: rlqs_pb2.BucketId, rule: int, ttl_s: int
) -> rlqs_pb2.RateLimitQuotaResponse.BucketAction:
    action = Action(bucket_id=bucket_id)
    assign = action.quota_assignment_action
    assign.assignment_time_to_live.seconds = ttl_s
    assign.rate_limit_strategy.blanket_rule = rule
    return action


def tokens(
    bucket_id: rlqs_pb2.BucketId, tokens: int
) -> rlqs_pb2.RateLimitQuotaResponse.BucketAction:
    action = Action(bucket_id=bucket_id)
    assign = action.quota_assignment_action
    assign.assignment_time_to_live.seconds = TOKENS_TTL_S
    bucket = assign.rate_limit_strategy.token_bucket
    bucket.max_tokens = tokens
    bucket.tokens_per_fill.value = 1
    # No refill while the assignment lives: the grant is all this stream may use.
    bucket.fill_interval.seconds = TOKENS_TTL_S + 1
    return action


def abandon(bucket_id: rlqs_pb2.BucketId) -> rlqs_pb2.RateLimitQuotaResponse.BucketAction:
    action = Action(bucket_id=bucket_id)
    action.abandon_action.SetInParent()
    return action


class Answer:
    """Bucket actions of one report or push, queued in messages of ~RESPONSE_ACTIONS actions
    as they are made (one bucket's actions always in one message)."""

    def __init__(self, send: Callable[[bytes], None]) -> None:
        self.send = send
        self.message = rlqs_pb2.RateLimitQuotaResponse()

    def add(self, *actions: rlqs_pb2.RateLimitQuotaResponse.BucketAction) -> None:
        held = len(self.message.bucket_action)
        if held and held + len(actions) > RESPONSE_ACTIONS:
            self.flush()
        self.message.bucket_action.extend(actions)

    def flush(self) -> None:
        if self.message.bucket_action:
            self.send(self.message.SerializeToString())
            self.message = rlqs_pb2.RateLimitQuotaResponse()
