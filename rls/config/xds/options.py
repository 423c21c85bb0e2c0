"""The xDS client's flags and its reconnect back-off (the forms of its values, `k1:v1,k2:v2`
lists and Go durations, are the settings' own: rls.settings.forms)."""

from __future__ import annotations

import random


class Backoff:
    """Jittered exponential back-off between reconnects: `initial`, doubling up to `maximum`,
    each delay drawn within ±`random_factor` of its value when `jitter` is on. `reset()` after
    a stream that delivered a response (the next loss starts from `initial` again)."""

    def __init__(
        self, initial: float, maximum: float, random_factor: float, jitter: bool,
        rng: random.Random | None = None,
    ) -> None:
        self.initial = initial
        self.maximum = max(maximum, initial)
        self.random_factor = min(random_factor, 1.0)
        self.jitter = jitter
        self.attempt = 0
        self.rng = rng or random.Random()

    def reset(self) -> None:
        self.attempt = 0

    def next(self) -> float:
        base = min(self.maximum, self.initial * 2.0 ** min(self.attempt, 62))
        self.attempt += 1
        if not self.jitter or self.random_factor <= 0:
            return base
        spread = base * self.random_factor
        return min(self.maximum, max(0.0, base - spread + self.rng.random() * 2 * spread))


# `rls serve` flags of the xDS client (rls.cli.serve.FLAGS); each also reads RLS_<NAME> and the
# reference's variable (rls.settings.environment.REFERENCE_ENV).
XDS_FLAGS = {
    "config_type": "where limits come from: FILE (--config) or GRPC_XDS_SOTW (a control "
    "plane over xDS)",
    "xds_server_url": "xDS management server host:port",
    "xds_node_id": "node id sent to the management server",
    "xds_node_metadata": "node metadata, k1:v1,k2:v2",
    "xds_additional_headers": "gRPC metadata on the xDS stream, k1:v1,k2:v2",
    "xds_server_use_tls": "TLS to the management server",
    "xds_client_tls_cert": "client certificate (PEM) for mTLS to the management server",
    "xds_client_tls_key": "its private key (PEM)",
    "xds_server_tls_cacert": "CA bundle (PEM) the management server's certificate must chain "
    "to; '' = system roots",
    "xds_server_tls_san": "name the management server's certificate must carry (default: the "
    "URL's host)",
    "xds_connect_retry_interval": "wait between attempts to reach the management server "
    "(seconds or 3s, 1m)",
    "xds_backoff_initial": "first wait before reopening a lost xDS stream (seconds or 10s)",
    "xds_backoff_max": "longest wait before reopening a lost xDS stream (seconds or 60s)",
    "xds_backoff_random_factor": "each wait is drawn within ± this share of its value",
    "xds_backoff_jitter": "randomise the waits (on/off)",
    "xds_max_msg_bytes": "largest xDS response accepted (0 = 4 MiB)",
    "force_start_without_initial_config": "xDS: serve before the first config arrives "
    "(every call OK until then)",
    "healthy_with_at_least_one_config_loaded": "health says not serving until a config with "
    "a domain is in force",
}
