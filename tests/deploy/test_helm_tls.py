"""The Helm chart's TLS option: rls gets the Secret's files (a directory mount, so Kubernetes
updates reach it), the TLS settings validate, probes work without TLS-speaking kubelet gRPC
probes, and the sidecar's commented mTLS block validates in Envoy once uncommented."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from grpc_access.envoy_tls import HELM_DIR, enable_mtls
from grpc_access.test_envoy_mtls import _mtls_files

from rls.cli.main import parser
from rls.cli.serve import settings_from

from .test_helm import container, manifests, only

TLS_ON: dict[str, Any] = {
    "tls": {"enabled": True, "secretName": "rls-tls", "requireClientCert": True,
            "clientSan": "spiffe://cluster.local/ns/gw/sa/envoy"},
}


def _pod(overrides: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    deploy = only(manifests(overrides), "Deployment")
    return deploy["spec"]["template"]["spec"], container(deploy, "rls")


@pytest.mark.parametrize("token", [False, True], ids=["no-admin-token", "admin-token"])
def test_tls_mounts_the_secret_as_a_directory_and_sets_every_tls_setting(
    token: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    overrides = {**TLS_ON, **({"adminToken": {"value": "t0ken"}} if token else {})}
    pod, rls = _pod(overrides)
    env = {e["name"]: e.get("value") for e in rls["env"]}
    for name, value in env.items():
        if name.startswith("RLS_GRPC_TLS"):
            monkeypatch.setenv(name, value)
    if token:
        monkeypatch.setenv("RLS_ADMIN_TOKEN", "t0ken")
    settings = settings_from(parser().parse_args(rls["args"]))
    assert settings.grpc_tls
    assert settings.grpc_tls_client_ca == "/etc/rls/tls/ca.crt"
    assert settings.grpc_tls_client_san == TLS_ON["tls"]["clientSan"]
    (mount,) = [m for m in rls["volumeMounts"] if m["mountPath"] == "/etc/rls/tls"]
    assert "subPath" not in mount  # a subPath mount never sees the Secret's updates
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes[mount["name"]]["secret"]["secretName"] == "rls-tls"
    for probe in ("livenessProbe", "readinessProbe"):
        assert "grpc" not in rls[probe]  # kubelet's gRPC probe cannot speak TLS
        assert ("httpGet" in rls[probe]) == token
        assert ("tcpSocket" in rls[probe]) != token


def test_tls_without_client_certificates_sets_no_client_ca() -> None:
    _, rls = _pod({"tls": {**TLS_ON["tls"], "requireClientCert": False, "clientSan": ""}})
    names = {e["name"] for e in rls["env"]}
    assert "RLS_GRPC_TLS" in names and "RLS_GRPC_TLS_CLIENT_CA" not in names


def test_the_sidecar_mtls_block_validates_in_envoy_once_uncommented(
    envoy_binary: str, tmp_path: Path
) -> None:
    deploy = only(manifests({**TLS_ON, "envoy": {"enabled": True,
                                                 "tlsSecretName": "envoy-rls-client"}}),
                  "Deployment")
    envoy = container(deploy, "envoy")
    assert {m["mountPath"] for m in envoy["volumeMounts"]} >= {HELM_DIR.rstrip("/")}
    objs = manifests({**TLS_ON, "envoy": {"enabled": True}})
    cm = next(o for (kind, name), o in objs.items()
              if kind == "ConfigMap" and name.endswith("-envoy"))
    _, envoy_dir, _ = _mtls_files(tmp_path)
    text = enable_mtls(cm["data"]["envoy.yaml"], envoy_dir, HELM_DIR)
    clusters = yaml.safe_load(text)["static_resources"]["clusters"]
    assert any("transport_socket" in c for c in clusters)
    (tmp_path / "envoy.yaml").write_text(text)
    done = subprocess.run([envoy_binary, "--mode", "validate", "-c", str(tmp_path / "envoy.yaml")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
