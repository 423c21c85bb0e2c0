"""The bounds of quota mode: what one RLQS stream and all of them together may hold.

Each is read from an `RLS_QUOTA_*` environment variable (through rls.settings.environment; defaults
below; docs/quota-mode.md lists them). A value that is not a positive number stops rls at
start with the variable named.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from rls.settings.environment import quota_bound_texts

MIB = 1 << 20
SLICE_BUCKETS = 32  # buckets dealt or given back at once (one pipelined Redis round trip)


@dataclass(frozen=True, slots=True)
class QuotaBounds:
    # Answers queued for a client that has not read them yet. Over the per-stream cap rls reads
    # no further report from that stream (gRPC flow control then holds the client back); over
    # the global cap no stream's next report is read until the total falls.
    stream_queue_bytes: int = 4 * MIB
    queue_bytes: int = 64 * MIB
    # A stream holding unread answers that has not taken one for this long is ended with
    # RESOURCE_EXHAUSTED (Envoy reads its answers within milliseconds).
    stalled_s: float = 30.0
    # One bucket id (its keys and values as sent): a bigger one is refused (abandon_action).
    bucket_id_bytes: int = 4096
    # The bucket ids one stream, and all streams together, keep; beyond, a new bucket gets the
    # failure rule for 6 s and no state (like the per-stream count cap).
    stream_bucket_bytes: int = 8 * MIB
    bucket_bytes: int = 64 * MIB
    # A report is worked through in slices of at most this many milliseconds of the event
    # loop (and at most SLICE_BUCKETS buckets), so other callers never wait longer.
    slice_ms: float = 2.0
    # A stream that ended leaves its buckets' reservations to the next stream of the same
    # bucket in this process for this long (Envoy reconnects at its next 5 s report); then
    # they are released.
    adopt_s: float = 15.0

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> QuotaBounds:
        """The bounds with each RLS_QUOTA_<FIELD> set (read by rls.settings.environment) in
        force."""
        defaults = {f.name: f.default for f in fields(cls)}
        values: dict[str, float | int] = {}
        for field_name, (name, text) in quota_bound_texts(defaults, environ).items():
            kind = float if isinstance(defaults[field_name], float) else int
            try:
                value = kind(text)
            except ValueError:
                raise ValueError(f"{name} must be a positive number, not {text!r}") from None
            if value <= 0:
                raise ValueError(f"{name} must be a positive number, not {text!r}")
            values[field_name] = value
        return cls(**values)  # type: ignore[arg-type]
