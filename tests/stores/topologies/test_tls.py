"""TLS: a redis-server listening only on a TLS port (Debian's redis 7.0 is built with TLS; if
the installed one is not, the `tls_redis` fixture fails with that message — never a skip).

`rediss://…?ssl_ca_certs=<CA>` decides exactly; every way of getting TLS wrong (a CA that did not
sign the server certificate, rediss:// to a plaintext port, redis:// to the TLS port) fails fast
with the failure mode and is counted in rls_backend_errors_total."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import RedisServer, http_get, wait_until

from .rlsclient import (
    OK,
    OVER,
    SLACK_S,
    TIMEOUT_MS,
    Client,
    backend_errors,
    desc,
    start_rls,
    used,
    write_config,
)
from .servers import ClientCert, Proc, TlsFiles

pytestmark = pytest.mark.redis

DOMAIN = "tls"
CONFIG = """
domain: tls
descriptors:
  - key: k
    rate_limit: {unit: year, requests_per_unit: 3}
"""


def test_rediss_with_trusted_ca_decides_exactly(tls_redis: Proc, tls_files: TlsFiles,
                                                rls_factory, tmp_path: Path):
    tls_redis.client().flushall()
    url = f"rediss://127.0.0.1:{tls_redis.port}/0?ssl_ca_certs={tls_files.ca}"
    rls = start_rls(rls_factory, write_config(tmp_path, CONFIG), url)
    client = Client(rls.grpc_addr, DOMAIN)
    try:
        for remaining in (2, 1, 0):
            a = client.call(desc(("k", "tls")))
            assert a.decided and a.code == OK and a.resp.statuses[0].limit_remaining == remaining
        a = client.call(desc(("k", "tls")))
        assert a.decided and a.code == OVER, a.resp
    finally:
        client.close()
    assert used(rls.http_url, DOMAIN, ("k", "tls")) == [3]
    assert backend_errors(rls.http_url) == 0
    # The server has no plaintext port: the counter can only have arrived over TLS.
    assert tls_redis.client().dbsize() == 1


@pytest.mark.parametrize(("case", "mode"), [
    ("untrusted_ca", "deny"),
    ("rediss_to_plain_port", "allow"),
    ("redis_to_tls_port", "allow"),
])
def test_tls_misconfiguration_fails_fast_with_failure_mode(
    case: str, mode: str, tls_redis: Proc, tls_files: TlsFiles, redis_server: RedisServer,
    rls_factory, tmp_path: Path,
):
    url = {
        "untrusted_ca": f"rediss://127.0.0.1:{tls_redis.port}/0?ssl_ca_certs={tls_files.other_ca}",
        "rediss_to_plain_port": f"rediss://127.0.0.1:{redis_server.port}/0",
        "redis_to_tls_port": f"redis://127.0.0.1:{tls_redis.port}/0",
    }[case]
    rls = start_rls(rls_factory, write_config(tmp_path, CONFIG), url, "--failure-mode", mode,
                    ready=False)
    wait_until(lambda: "not ready: redis not reachable" in rls.log(), timeout=10,
               what="the unusable store logged")
    assert http_get(rls.http_url + "/healthcheck")[0] == 500  # never ready on a bad TLS setup
    expected = OK if mode == "allow" else OVER
    client = Client(rls.grpc_addr, DOMAIN)
    try:
        answers = [client.call(desc(("k", case))) for _ in range(5)]
    finally:
        client.close()
    for a in answers:
        assert a.code == expected and not a.decided, a.resp
        assert a.seconds <= TIMEOUT_MS / 1000 + SLACK_S, f"answer took {a.seconds:.3f}s"
    assert backend_errors(rls.http_url) >= 5
    wait_until(lambda: "backend redis failed" in rls.log(), timeout=5,
               what="the backend failure logged")
    if case == "untrusted_ca":
        assert "CERTIFICATE_VERIFY_FAILED" in rls.log() or "certificate verify failed" in \
            rls.log(), rls.log()


def test_client_certificate_from_the_reference_env_decides_on_a_redis_requiring_one(
    mtls_redis: Proc, tls_files: TlsFiles, client_cert: ClientCert, rls_factory,
    tmp_path: Path,
):
    """REDIS_TLS_CLIENT_CERT / _KEY / REDIS_TLS_CACERT (the reference's names) reach every
    connection rls opens: the pool, the lean wire, the probe's own connection."""
    mtls_redis.client().flushall()
    env = {"REDIS_TLS_CLIENT_CERT": str(client_cert.cert),
           "REDIS_TLS_CLIENT_KEY": str(client_cert.key),
           "REDIS_TLS_CACERT": str(tls_files.ca)}
    url = f"rediss://127.0.0.1:{mtls_redis.port}/0"
    rls = start_rls(rls_factory, write_config(tmp_path, CONFIG), url, env=env)
    client = Client(rls.grpc_addr, DOMAIN)
    try:
        for remaining in (2, 1, 0):
            a = client.call(desc(("k", "mtls")))
            assert a.decided and a.code == OK and a.resp.statuses[0].limit_remaining == remaining
    finally:
        client.close()
    assert backend_errors(rls.http_url) == 0
    assert mtls_redis.client().dbsize() == 1


def test_without_a_client_certificate_a_redis_requiring_one_is_never_ready(
    mtls_redis: Proc, tls_files: TlsFiles, rls_factory, tmp_path: Path,
):
    env = {"RLS_REDIS_TLS_CACERT": str(tls_files.ca)}
    url = f"rediss://127.0.0.1:{mtls_redis.port}/0"
    rls = start_rls(rls_factory, write_config(tmp_path, CONFIG), url, env=env, ready=False)
    wait_until(lambda: "not ready: redis not reachable" in rls.log(), timeout=10,
               what="the refused handshake logged")
    assert http_get(rls.http_url + "/healthcheck")[0] == 500


@pytest.mark.parametrize("variable", ["REDIS_TLS_CLIENT_CERT", "RLS_REDIS_TLS_CLIENT_KEY",
                                      "REDIS_TLS_CACERT"])
def test_a_missing_tls_file_stops_rls_at_start_naming_it(
    variable: str, rls_factory, tmp_path: Path,
):
    missing = tmp_path / "absent.pem"
    rls = rls_factory(write_config(tmp_path, CONFIG),
                      args=("--redis-url", "rediss://127.0.0.1:6380/0"),
                      env={variable: str(missing)}, wait_healthy=False)
    assert rls.proc.wait(timeout=60) == 2
    assert f"{variable}: {missing}: no such file" in rls.log()
