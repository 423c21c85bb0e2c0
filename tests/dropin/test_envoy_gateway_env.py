"""`/bin/ratelimit` with Envoy Gateway's environment, no arguments, comes up and serves.

What EG relies on: gRPC RateLimitService on GRPC_PORT, `GET /healthcheck` 200 on PORT (its
startup, readiness and liveness probes; PORT listens on every interface), the Prometheus
metrics on PROMETHEUS_ADDR, counters in the user's Redis (REDIS_URL), and a container run as
uid/gid 65534 that can write nothing but /tmp. The admin port, off loopback without a token,
must not take state-changing calls. Variants: CONFIG_TYPE=FILE (limits from the RUNTIME_*
directory) and GRPC_XDS_SOTW (EG's own: the same limit pushed by an in-test ADS server over
mTLS, nothing under RUNTIME_ROOT); tests/dropin/test_envoy_gateway_xds.py adds Envoy, a new
snapshot and tracing to the xDS variant.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from config.xds.ads_server import AdsServer, domain, limit
from envoy.service.ratelimit.v3 import rls_pb2
from support.redis_server import RedisServer

from rls.settings.reference_env import REFERENCE_VARIABLES, honoured, xds_supported

from .helpers import (
    EG_ENV,
    EgCertificates,
    Ratelimit,
    config_text,
    decide,
    eg_certificates,
    eg_environment,
    grpc_channel,
    ignored_lines,
    write,
)

OK, OVER = rls_pb2.RateLimitResponse.OK, rls_pb2.RateLimitResponse.OVER_LIMIT
NOBODY = 65534  # EG's runAsUser / runAsGroup
CONFIG_VARIANTS = ["FILE", "GRPC_XDS_SOTW"]
USERS = {"same-user": None, "uid-65534": NOBODY}


@pytest.mark.parametrize("user", list(USERS))
@pytest.mark.parametrize("config_type", CONFIG_VARIANTS)
def test_eg_environment_serves_limits_health_and_metrics(
    config_type: str, user: str, root: Path, redis_server: RedisServer,
    launch: Callable[..., Ratelimit], eg_ads: Callable[[EgCertificates], AdsServer],
) -> None:
    redis_server.client().flushall()
    pki = eg_certificates(root)
    certs = pki.mount
    env, ports = eg_environment(root, redis_server.port, config_type)
    if config_type == "FILE":
        write(root / "data/ratelimit/config/eg.yaml", config_text("eg", "client", 2))
        assert os.stat(root / "data/ratelimit/config/eg.yaml").st_mode & 0o004  # world-readable
    else:
        ads = eg_ads(pki)
        ads.set_snapshot("1", [domain("eg", limit("client", "MINUTE", 2))])
        env["CONFIG_GRPC_XDS_SERVER_URL"] = ads.url
    rl = launch(env, user=USERS[user])
    if config_type != "FILE":
        assert ads.wait_ack("1").node.id == EG_ENV["CONFIG_GRPC_XDS_NODE_ID"]
    if USERS[user] is not None:
        status = Path(f"/proc/{rl.proc.pid}/status").read_text()
        assert f"Uid:\t{NOBODY}\t" in status and f"Gid:\t{NOBODY}\t" in status

    with grpc_channel(rl, certs) as channel:
        codes = [decide(channel, "eg", "client", "a") for _ in range(3)]
    assert codes == [OK, OK, OVER], rl.log()
    assert redis_server.client().dbsize() > 0  # counted in the user's Redis

    assert rl.http("/healthcheck") == (200, "OK")
    for path, method in (("/switches", "POST"), ("/json", "POST"), ("/top", "GET")):
        assert rl.http(path, method)[0] == 404, f"{method} {path} open on the probe port"
    status, text = rl.http("/metrics", port=ports.prometheus)
    assert status == 200
    assert 'rls_limit_over_limit_total{key="eg.client"} 1.0' in text
    # beside it, the reference's name for it (what EG's dashboard reads)
    assert 'ratelimit_service_rate_limit_over_limit{domain="eg",key1="client"} 1.0' in text
    assert rl.http("/metrics", port=ports.prometheus)[0] == 200
    assert rl.http("/healthcheck", port=ports.prometheus)[0] == 404  # metrics only

    lines = ignored_lines(rl.log())
    expected = sorted(n for n in REFERENCE_VARIABLES if n in env and n not in honoured())
    assert lines == ([expected] if expected else []), rl.log()
    assert "PROMETHEUS_MAPPER_YAML" in expected  # the file is not read (docs/metrics.md)
    for read in ("RUNTIME_ROOT", "REDIS_URL", "USE_PROMETHEUS", "PROMETHEUS_ADDR", "PORT"):
        assert read not in expected
    # nothing written into its working directory (for uid 65534: it could not)
    made = ["certs", "certs-work"] + (["data"] if config_type == "FILE" else [])
    assert sorted(p.name for p in root.iterdir()) == made


def test_eg_environment_in_xds_mode_starts_without_a_config_directory(
    root: Path, redis_server: RedisServer, launch: Callable[..., Ratelimit],
) -> None:
    """EG's own mode: nothing under RUNTIME_ROOT, limits from the controller over xDS (here:
    no controller at all). It starts, answers its probes and every call (no limits yet)."""
    certs = eg_certificates(root).mount
    env, _ports = eg_environment(root, redis_server.port, "GRPC_XDS_SOTW")
    assert env["CONFIG_TYPE"] == EG_ENV["CONFIG_TYPE"]
    assert not (root / "data").exists()
    rl = launch(env)
    with grpc_channel(rl, certs) as channel:
        assert decide(channel, "eg", "client", "a") == OK
    if not xds_supported():
        assert "this rls has no xDS config client" in rl.log()


def test_file_mode_without_the_config_directory_names_it_and_exits_2(
    root: Path, redis_server: RedisServer, launch: Callable[..., Ratelimit],
) -> None:
    env, _ports = eg_environment(root, redis_server.port, "FILE")
    rl = launch(env, wait_healthy=False)
    assert rl.proc.wait(30) == 2
    assert (f"ratelimit: CONFIG_TYPE=FILE: the config directory {root}/data/ratelimit/config "
            "(RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY) does not exist"
            in rl.log())
