"""Certificates for the xDS TLS tests (openssl, P-256): a CA, a management server certificate
whose only name is `xds.example` (not 127.0.0.1, so only a SAN override can match it), and a
client certificate for mTLS."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

EC_KEY = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1")
SERVER_SAN = "xds.example"


@dataclass
class Certs:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _openssl(workdir: Path, *args: str) -> None:
    done = subprocess.run(["openssl", *args], cwd=str(workdir), capture_output=True, text=True,
                          timeout=60)
    if done.returncode != 0:
        raise AssertionError(f"openssl {' '.join(args)} failed:\n{done.stderr}")


def make_certs(workdir: Path) -> Certs:
    _openssl(workdir, "req", "-x509", *EC_KEY, "-nodes", "-days", "2", "-keyout", "ca.key",
             "-out", "ca.crt", "-subj", "/CN=rls xds test ca")
    for name, san in (("server", f"DNS:{SERVER_SAN}"), ("client", "DNS:rls.client")):
        _openssl(workdir, "req", *EC_KEY, "-nodes", "-keyout", f"{name}.key",
                 "-out", f"{name}.csr", "-subj", f"/CN={san.split(':')[1]}")
        (workdir / f"{name}.cnf").write_text(f"subjectAltName={san}\n")
        _openssl(workdir, "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt",
                 "-CAkey", "ca.key", "-CAcreateserial", "-days", "2", "-out", f"{name}.crt",
                 "-extfile", f"{name}.cnf")
    for name in ("ca.key", "server.key", "client.key"):
        os.chmod(workdir / name, 0o600)
    return Certs(workdir / "ca.crt", workdir / "server.crt", workdir / "server.key",
                 workdir / "client.crt", workdir / "client.key")
