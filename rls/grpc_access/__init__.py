"""Who may call rls's gRPC listeners.

- `tls`: TLS and mTLS on every gRPC listener (grpcio's dynamic credentials), certificate files
  watched and reloaded without a restart, their expiry as a metric;
- `tls_refusals`: clients refused by TLS, counted by reason, and the per-call SAN check;
- `token_auth`: the optional bearer token (`--grpc-token`) every call but health must carry.

The server (rls.process.server) wraps each listener with them; `rls serve` checks the TLS files
before anything starts (rls.cli.serve).
"""
