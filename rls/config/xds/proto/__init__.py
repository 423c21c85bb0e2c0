"""The reference's RateLimitConfig resource (rls_conf.proto), compiled by grpcio-tools."""
