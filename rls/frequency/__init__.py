"""Frequency counters as a service (docs/counters.md): Add / Get with per-call windows.

model   — items, validation, windows, key layout, per-domain options
stores  — the memory and Redis stores (one script call per batch on Redis)
caches  — the stale last-known-value cache and the hot-key cache
service — the operations with their degradation rules, shared by gRPC and admin HTTP
grpc_api — `rls.counters.v1.Counters` on the RateLimitService port
"""
