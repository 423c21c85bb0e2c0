"""ResponseShapes: an answer's bytes from a message kept per shape are byte for byte what
building the message afresh (to_response) gives, whatever sequence of decisions reuses it."""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import given, settings

from rls.config.model import Limit, Unit
from rls.engine.decision import Decision, Status
from rls.engine.limiter import OK, OVER_LIMIT
from rls.memo import RESPONSE_SHAPE_ENTRIES
from rls.services.convert import ResponseShapes, to_response

LIMITS = [
    Limit(10, Unit.SECOND),
    Limit(1_000_000_000, Unit.MINUTE, name="items_per_user"),
    Limit(5, Unit.HOUR, unit_multiplier=3),  # sent as an unknown field
    Limit(7, Unit.DAY, name="daily"),
]

statuses = st.builds(
    Status,
    code=st.sampled_from([OK, OVER_LIMIT]),
    limit=st.sampled_from([None, *LIMITS]),
    remaining=st.sampled_from([0, 1, 127, 128, 999_999_990, 2**32 - 1]),
    reset_ms=st.sampled_from([None, 0, 1, 999, 1000, 1001, 59_999, 86_400_000]),
)
decisions = st.builds(
    Decision,
    overall=st.sampled_from([OK, OVER_LIMIT]),
    statuses=st.lists(statuses, min_size=1, max_size=4),
)


@settings(max_examples=300)
@given(st.lists(decisions, min_size=1, max_size=30))
def test_kept_shapes_answer_exactly_what_a_fresh_message_serialises(
    sequence: list[Decision],
) -> None:
    shapes = ResponseShapes()
    for decision in sequence:
        assert shapes.serialize(decision) == to_response(decision).SerializeToString()


def test_a_shape_seen_again_reuses_its_message_with_the_new_values() -> None:
    shapes = ResponseShapes()
    limit = LIMITS[0]
    first = Decision(OK, [Status(OK, limit, 9, 400)])
    again = Decision(OK, [Status(OK, limit, 3, 1400)])
    shapes.serialize(first)
    assert len(shapes._cache) == 1
    assert shapes.serialize(again) == to_response(again).SerializeToString()
    assert len(shapes._cache) == 1  # the same shape: no second message


def test_shapes_stay_within_their_entry_bound() -> None:
    shapes = ResponseShapes()
    for i in range(RESPONSE_SHAPE_ENTRIES + 50):
        limit = Limit(i + 1, Unit.MINUTE)  # a new limit object: a new shape
        shapes.serialize(Decision(OK, [Status(OK, limit, i, 1000)]))
    assert len(shapes._cache) <= RESPONSE_SHAPE_ENTRIES
