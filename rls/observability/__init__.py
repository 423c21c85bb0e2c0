"""What rls tells its operators: Prometheus metrics and log lines.

- `metrics`: every Prometheus family (bounded cardinality; the hot path adds to plain numbers
  that `flush()` pushes), also the sizes of the bounded memos (rls.memo);
- `logs`: text or JSON logs on stderr (under `--workers`, each line says which process wrote
  it), `LogGate` (the one throttle for repetitive lines), grpc.aio's late-answer errors folded
  into one line a second.

Low in the import graph (over settings, core and memo) so every layer can count and log.
Tracing is its own package (rls.tracing), above the services whose handlers it wraps.
"""
