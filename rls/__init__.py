"""rls: an Envoy external rate-limit service compatible with envoyproxy/ratelimit config."""

__version__ = "0.1.0"
