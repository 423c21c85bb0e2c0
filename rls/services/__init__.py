"""gRPC services: RateLimitService, health (and the ext_proc cache when configured)."""
