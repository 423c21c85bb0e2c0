"""Quota mode: serve Envoy's Rate Limit Quota Service (RLQS) from the same YAML and counters.

`match` maps bucket ids onto descriptors, `share` deals each stream its share of a limit's
remaining quota through reservations on the ShouldRateLimit counters, `metrics` are the
Prometheus series; the gRPC stream itself is rls.services.quota.
"""
