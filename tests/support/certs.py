"""Certificates for TLS tests, made by the `openssl` command: a CA, and certificates it issues
(server or client, any SANs, valid now or already expired).

    ca = CertAuthority.create(tmp_path / "ca")
    server = ca.issue("server", sans=("DNS:localhost", "IP:127.0.0.1"))
    client = ca.issue("client", sans=("URI:spiffe://test/envoy",), client=True)
    expired = ca.issue("old", client=True, expired=True)
    other = CertAuthority.create(tmp_path / "other-ca").issue("stranger", client=True)

EC P-256 keys: made in milliseconds, so every test can have its own.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

EC_KEY = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1")
# `openssl ca` (not `x509 -req`) so a certificate can carry any validity period, past included.
CA_CONFIG = """\
[ ca ]
default_ca = rls_test
[ rls_test ]
database = {dir}/index.txt
new_certs_dir = {dir}/issued
serial = {dir}/serial
default_md = sha256
policy = anything
unique_subject = no
[ anything ]
commonName = supplied
"""


def openssl(*args: str, cwd: Path) -> None:
    done = subprocess.run(["openssl", *args], cwd=str(cwd), capture_output=True, text=True,
                          timeout=30)
    if done.returncode != 0:
        raise AssertionError(f"openssl {' '.join(args)} failed:\n{done.stderr}")


@dataclass(frozen=True)
class Issued:
    """A certificate and its key (PEM files)."""

    cert: Path
    key: Path

    def read(self) -> tuple[bytes, bytes]:
        """(key, certificate chain) bytes, the order grpc's credentials take them."""
        return self.key.read_bytes(), self.cert.read_bytes()


@dataclass(frozen=True)
class CertAuthority:
    directory: Path
    cert: Path
    key: Path

    @classmethod
    def create(cls, directory: Path, name: str = "rls test CA") -> CertAuthority:
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "issued").mkdir(exist_ok=True)
        (directory / "index.txt").write_text("")
        (directory / "serial").write_text("1000\n")
        (directory / "ca.cnf").write_text(CA_CONFIG.format(dir=directory))
        openssl("req", "-x509", *EC_KEY, "-nodes", "-days", "3", "-subj", f"/CN={name}",
                "-keyout", "ca.key", "-out", "ca.crt", cwd=directory)
        return cls(directory, directory / "ca.crt", directory / "ca.key")

    def issue(self, name: str, sans: Sequence[str] = ("DNS:localhost", "IP:127.0.0.1"),
              client: bool = False, expired: bool = False, dual_use: bool = False) -> Issued:
        """A certificate for `name` (its CN), signed by this CA, in files `<name>.crt/.key`.

        `dual_use`: good for serving and for dialling (serverAuth and clientAuth), as the one
        certificate of Envoy Gateway's `envoy-rate-limit` Secret that the rate-limit service
        both serves gRPC with and presents to the xDS management server."""
        d = self.directory
        usage = "serverAuth, clientAuth" if dual_use else "clientAuth" if client else "serverAuth"
        ext = d / f"{name}.ext"
        ext.write_text(
            "basicConstraints = CA:FALSE\n"
            f"extendedKeyUsage = {usage}\n"
            + (f"subjectAltName = {', '.join(sans)}\n" if sans else "")
        )
        openssl("req", *EC_KEY, "-nodes", "-subj", f"/CN={name}", "-keyout", f"{name}.key",
                "-out", f"{name}.csr", cwd=d)
        dates = (("-startdate", "20200101000000Z", "-enddate", "20200102000000Z") if expired
                 else ("-days", "2"))
        openssl("ca", "-batch", "-notext", "-config", "ca.cnf", "-cert", "ca.crt",
                "-keyfile", "ca.key", "-in", f"{name}.csr", "-out", f"{name}.crt",
                "-extfile", ext.name, *dates, cwd=d)
        return Issued(d / f"{name}.crt", d / f"{name}.key")


class SecretMount:
    """A directory laid out as Kubernetes mounts a Secret, and updated as the kubelet does:
    `tls.crt -> ..data/tls.crt`, `..data -> ..<timestamp>`; an update writes a new timestamped
    directory, points `..data_tmp` at it and renames that over `..data` (one atomic swap),
    then removes the old directory."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.generation = 0
        directory.mkdir(parents=True, exist_ok=True)

    def path(self, name: str) -> Path:
        return self.directory / name

    def write(self, files: dict[str, bytes]) -> None:
        self.generation += 1
        d = self.directory
        new = d / f"..2026_11_28_00_00_{self.generation:02d}"
        new.mkdir()
        for name, data in files.items():
            (new / name).write_bytes(data)
        old = (d / "..data").resolve() if (d / "..data").is_symlink() else None
        tmp = d / "..data_tmp"
        tmp.symlink_to(new.name)
        tmp.replace(d / "..data")
        for name in files:
            link = d / name
            if not link.is_symlink():
                link.symlink_to(f"..data/{name}")
        if old is not None:
            for child in old.iterdir():
                child.unlink()
            old.rmdir()
