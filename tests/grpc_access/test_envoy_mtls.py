"""A real Envoy 1.40 calls rls over mTLS with the block shipped (commented) in envoy/, and is
limited: Envoy presents its client certificate (with the SAN rls requires) and checks rls's
certificate against the CA and the name in `sni`."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.certs import CertAuthority

from .envoy_tls import enable_mtls
from .helpers import ROOT, SAN, metric

pytestmark = pytest.mark.envoy

PER_PATH = 3
DESCRIPTORS = f"""\
domain: gateway
descriptors:
  - key: user
    descriptors:
      - key: path
        rate_limit: {{unit: day, requests_per_unit: {PER_PATH}}}
  - key: remote_address
    rate_limit: {{unit: day, requests_per_unit: 100000}}
"""


def _mtls_files(tmp_path: Path) -> tuple[CertAuthority, Path, tuple[str, ...]]:
    """A CA; Envoy's files where the shipped block reads them; rls's TLS flags."""
    ca = CertAuthority.create(tmp_path / "pki")
    rls_cert = ca.issue("rls", sans=("DNS:rls.internal", "DNS:localhost", "IP:127.0.0.1"))
    envoy_cert = ca.issue("envoy", sans=(f"URI:{SAN}",), client=True)
    envoy_dir = tmp_path / "envoy-tls"
    envoy_dir.mkdir()
    (envoy_dir / "tls.crt").write_bytes(envoy_cert.cert.read_bytes())
    (envoy_dir / "tls.key").write_bytes(envoy_cert.key.read_bytes())
    (envoy_dir / "ca.crt").write_bytes(ca.cert.read_bytes())
    flags = ("--grpc-tls", "on", "--grpc-tls-cert", str(rls_cert.cert),
             "--grpc-tls-key", str(rls_cert.key), "--grpc-tls-client-ca", str(ca.cert),
             "--grpc-tls-client-san", SAN)
    return ca, envoy_dir, flags


def test_envoy_with_the_shipped_mtls_block_is_limited_by_rls_over_mtls(
    gateway_factory: Callable[..., Any], tmp_path: Path
) -> None:
    _, envoy_dir, flags = _mtls_files(tmp_path)
    config = tmp_path / "gateway-mtls.yaml"
    config.write_text(enable_mtls((ROOT / "envoy" / "gateway.yaml").read_text(), envoy_dir))
    gw = gateway_factory(DESCRIPTORS, config, rls_args=flags)
    codes = [gw.call("/mtls/limited", "alice").status for _ in range(PER_PATH + 1)]
    assert codes == [200] * PER_PATH + [429], gw.logs()
    refused = sum(metric(gw.rls.http_url, "rls_grpc_tls_refused_total", reason=r)
                  for r in ("not_tls", "no_certificate", "untrusted", "wrong_san"))
    assert refused == 0


SHIPPED = sorted(
    p for p in (ROOT / "envoy").glob("*.yaml") if "# transport_socket:" in p.read_text()
)


def test_every_config_that_calls_rls_ships_the_mtls_block() -> None:
    calls_rls = {p.name for p in (ROOT / "envoy").glob("*.yaml")
                 if any(name in p.read_text()
                        for name in ("ratelimit_service", "rlqs_service", "cache_service"))}
    assert calls_rls and calls_rls == {p.name for p in SHIPPED}


@pytest.mark.parametrize("shipped", SHIPPED, ids=[p.name for p in SHIPPED])
def test_the_shipped_mtls_block_validates_in_envoy_once_uncommented(
    envoy_binary: str, tmp_path: Path, shipped: Path
) -> None:
    _, envoy_dir, _ = _mtls_files(tmp_path)
    config = tmp_path / shipped.name
    config.write_text(enable_mtls(shipped.read_text(), envoy_dir))
    clusters = yaml.safe_load(config.read_text())["static_resources"]["clusters"]
    assert any("transport_socket" in c for c in clusters)
    done = subprocess.run([envoy_binary, "--mode", "validate", "-c", str(config)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
