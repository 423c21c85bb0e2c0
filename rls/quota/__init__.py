"""Quota mode: serve Envoy's Rate Limit Quota Service (RLQS) from the same YAML and counters.

The servicer is rls.services.quota. Here: `stream` (one Envoy's stream: reading, slicing,
answering reports, timers), `table` (its buckets: open, match, forget, evict), `respond` (the
actions sent), `pushes` (fresh grants at window ends), `orphans` (ended streams' buckets),
`context` (what every stream shares), `share` (dealing grants through reservations on the
ShouldRateLimit counters), `pacing` (how much a stream may take now), `ledger`, `bucket`,
`match` (bucket ids onto descriptors), `actions`, `outbox`, `bounds`, `metrics`, `tasks`.
"""
