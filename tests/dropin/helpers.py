"""Starting `/bin/ratelimit` (the `ratelimit` console script) the way Envoy Gateway does.

EG_ENV is the environment Envoy Gateway gives the reference's container (its rate-limit
infrastructure: names and values as EG sets them), with two kinds of values moved so that a
test can run anywhere: paths live under a temporary root instead of `/` (`/data`, `/certs`),
and ports are free ones instead of 8080/8081/19001 (other tests run beside these).
`eg_environment` does that relocation; a test picks the variant (CONFIG_TYPE) by
parametrisation.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import grpc
from config.xds.ads_server import AdsServer, TlsFiles
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from support.certs import CertAuthority
from support.net import free_port, http_call
from support.processes import stop_process
from support.waiting import wait_until

from rls.settings.reference_env import honoured

# Envoy Gateway's environment for the rate-limit container (see docs/envoy-gateway.md).
EG_ENV = {
    "RUNTIME_ROOT": "/data",
    "RUNTIME_SUBDIRECTORY": "ratelimit",
    "RUNTIME_IGNOREDOTFILES": "true",
    "RUNTIME_WATCH_ROOT": "false",
    "LOG_LEVEL": "info",
    "USE_STATSD": "false",
    "CONFIG_TYPE": "GRPC_XDS_SOTW",
    "CONFIG_GRPC_XDS_SERVER_URL": "envoy-gateway.envoy-gateway-system.svc.cluster.local:18001",
    "CONFIG_GRPC_XDS_NODE_ID": "envoy-ratelimit",
    "GRPC_SERVER_USE_TLS": "true",
    "GRPC_SERVER_TLS_CERT": "/certs/tls.crt",
    "GRPC_SERVER_TLS_KEY": "/certs/tls.key",
    "GRPC_SERVER_TLS_CA_CERT": "/certs/ca.crt",
    "CONFIG_GRPC_XDS_SERVER_USE_TLS": "true",
    "CONFIG_GRPC_XDS_CLIENT_TLS_CERT": "/certs/tls.crt",
    "CONFIG_GRPC_XDS_CLIENT_TLS_KEY": "/certs/tls.key",
    "CONFIG_GRPC_XDS_SERVER_TLS_CACERT": "/certs/ca.crt",
    "FORCE_START_WITHOUT_INITIAL_CONFIG": "true",
    "REDIS_SOCKET_TYPE": "tcp",
    "REDIS_URL": "redis.redis-system.svc.cluster.local:6379",
    "USE_PROMETHEUS": "true",
    "PROMETHEUS_ADDR": ":19001",
    "PROMETHEUS_MAPPER_YAML": "/etc/statsd-exporter/conf.yaml",
}
# What EG adds when tracing is on (its Telemetry settings; TRACING_SERVICE_INSTANCE_ID is the pod
# name). OTEL_EXPORTER_OTLP_TRACES_ENDPOINT (the collector) is the test's own.
EG_TRACING_ENV = {
    "TRACING_ENABLED": "true",
    "TRACING_SERVICE_NAME": "envoy-ratelimit",
    "TRACING_SERVICE_NAMESPACE": "envoy-gateway-system",
    "TRACING_SERVICE_INSTANCE_ID": "envoy-ratelimit-5d9c8b7f6d-x2x7q",
    "TRACING_SAMPLING_RATE": "1.0",
}
IGNORED_LINE = re.compile(r"reference variables set but ignored by rls: (.*) \(see ")
STATSD_LINE = "USE_STATSD=true: rls sends no statsd"


def ratelimit_script() -> str:
    """The `ratelimit` console script of this environment (what the image links at
    /bin/ratelimit)."""
    path = Path(sys.executable).parent / "ratelimit"
    assert path.exists(), f"{path} missing: pip install -e '.[test]' installs the console script"
    return str(path)


@dataclass
class Ports:
    grpc: int
    http: int
    prometheus: int


def eg_environment(root: Path, redis_port: int, config_type: str) -> tuple[dict[str, str], Ports]:
    """EG_ENV with `/` moved to `root`, free ports, the test's Redis and `config_type`."""
    ports = Ports(free_port(), free_port(), free_port())
    env = {k: v.replace("/data", f"{root}/data").replace("/certs/", f"{root}/certs/")
           .replace("/etc/statsd-exporter", f"{root}/etc/statsd-exporter")
           for k, v in EG_ENV.items()}
    env.update(CONFIG_TYPE=config_type, REDIS_URL=f"127.0.0.1:{redis_port}",
               GRPC_PORT=str(ports.grpc), PORT=str(ports.http),
               PROMETHEUS_ADDR=f":{ports.prometheus}")
    return env, ports


def world_readable_root() -> Path:
    """A fresh directory under /tmp that any user may read (pytest's tmp_path is private to
    its owner, and the uid-65534 runs must read the config and certificates)."""
    root = Path(tempfile.mkdtemp(prefix="rls-dropin-", dir="/tmp"))
    root.chmod(0o755)
    return root


@functools.cache
def as_user(user: int) -> tuple[str, ...]:
    """setpriv's prefix that runs a command as uid and gid `user`, no supplementary groups.

    The interpreter of a test environment may live where only root can search (pyenv under
    /root): then, and only then, the command keeps CAP_DAC_READ_SEARCH, which lets it read
    (never write) what its user could not. The image's own interpreter needs no such thing,
    and the tests check the modes of the files rls reads for themselves."""
    assert os.geteuid() == 0, "running as uid 65534 needs root (setpriv)"
    base = ("setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups")
    probe = [*base, sys.executable, "-c", "import sys; print(sys.version)"]
    seen = subprocess.run(probe, capture_output=True, text=True, timeout=30).stdout.strip()
    if seen == sys.version:
        return base
    return (*base, "--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search")


@dataclass
class Ratelimit:
    """A running `ratelimit` process and what the tests ask it."""

    proc: subprocess.Popen[bytes]
    log_path: Path
    ports: Ports

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def http(self, path: str, method: str = "GET", port: int | None = None) -> tuple[int, str]:
        status, body = http_call(f"http://127.0.0.1:{port or self.ports.http}", method, path,
                                 body=b"{}" if method == "POST" else None,
                                 headers={"Content-Type": "application/json"}, timeout=5)
        return status, body if isinstance(body, str) else str(body)

    def healthy(self) -> bool:
        return self.http("/healthcheck")[0] == 200

    def stop(self) -> int:
        return stop_process(self.proc, 10)


def start_ratelimit(env: dict[str, str], workdir: Path, log_dir: Path,
                    user: int | None = None, wait_healthy: bool = True) -> Ratelimit:
    """`ratelimit` with exactly `env` (nothing inherited), no arguments, `workdir` as its
    working directory; as uid/gid `user` (setpriv, groups cleared) when given."""
    cmd = [ratelimit_script()]
    if user is not None:
        cmd = [*as_user(user), *cmd]
    log_path = log_dir / f"ratelimit-{env.get('GRPC_PORT', 'x')}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                cwd=str(workdir))
    ports = Ports(int(env.get("GRPC_PORT", 8081)), int(env.get("PORT", 8080)),
                  int(env.get("PROMETHEUS_ADDR", ":0").rpartition(":")[2] or 0))
    rl = Ratelimit(proc, log_path, ports)
    if wait_healthy:
        wait_until(rl.healthy, timeout=30, what="ratelimit /healthcheck", log=rl.log,
                   alive=lambda: proc.poll() is None)
    return rl


def grpc_channel(rl: Ratelimit, certs: Path) -> grpc.Channel:
    """TLS when rls serves it for GRPC_SERVER_USE_TLS (the certificate EG mounts doubles as the
    client's, as for EG's own xDS client), else plaintext: what rls reads decides."""
    target = f"127.0.0.1:{rl.ports.grpc}"
    if "GRPC_SERVER_USE_TLS" not in honoured():
        return grpc.insecure_channel(target)
    creds = grpc.ssl_channel_credentials(
        (certs / "ca.crt").read_bytes(), (certs / "tls.key").read_bytes(),
        (certs / "tls.crt").read_bytes())
    return grpc.secure_channel(target, creds)


def decide(channel: grpc.Channel, domain: str, key: str, value: str) -> int:
    """One ShouldRateLimit call; the overall code."""
    stub = rls_pb2_grpc.RateLimitServiceStub(channel)
    entry = ratelimit_pb2.RateLimitDescriptor.Entry(key=key, value=value)
    request = rls_pb2.RateLimitRequest(
        domain=domain, descriptors=[ratelimit_pb2.RateLimitDescriptor(entries=[entry])])
    code: int = stub.ShouldRateLimit(request, timeout=5).overall_code
    return code


def ignored_lines(log: str) -> list[list[str]]:
    """The variables named by each "set but ignored" line of a log."""
    return [m.group(1).split(", ") for m in IGNORED_LINE.finditer(log)]


def config_text(domain: str, key: str, per_minute: int) -> str:
    return (f"domain: {domain}\ndescriptors:\n  - key: {key}\n    rate_limit:\n"
            f"      unit: minute\n      requests_per_unit: {per_minute}\n")


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp~")
    tmp.write_text(text)
    tmp.replace(path)
    return path


@dataclass(frozen=True)
class EgCertificates:
    """The Secret EG mounts (`mount`: tls.crt, tls.key, ca.crt) and the CA that signed it, which
    issues the other parties' certificates (the xDS server's, Envoy's)."""

    mount: Path
    ca: CertAuthority


def eg_certificates(root: Path) -> EgCertificates:
    """root/certs/{tls.crt,tls.key,ca.crt}, as EG's Secret mount (mode 0644, its
    defaultMode 420): a CA and one certificate signed by it, for rls.internal (the name the
    Envoy configs in envoy/ expect), localhost and 127.0.0.1, good for serving gRPC and for
    dialling the xDS server (EG uses the one certificate for both)."""
    ca = CertAuthority.create(root / "certs-work")
    tls = ca.issue("tls", sans=("DNS:rls.internal", "DNS:localhost", "IP:127.0.0.1"),
                   dual_use=True)
    certs = root / "certs"
    certs.mkdir()
    for source, name in ((tls.cert, "tls.crt"), (tls.key, "tls.key"), (ca.cert, "ca.crt")):
        shutil.copyfile(source, certs / name)
        (certs / name).chmod(0o644)
    return EgCertificates(certs, ca)


def start_eg_ads(certs: EgCertificates) -> AdsServer:
    """The in-test ADS server standing for EG's controller (its xDS port 18001): TLS with a
    certificate for 127.0.0.1 from the Secret's CA, client certificates required and checked
    against that CA (mTLS), no snapshot yet."""
    xds = certs.ca.issue("xds-server", sans=("DNS:localhost", "IP:127.0.0.1"))
    return AdsServer(tls=TlsFiles(str(xds.cert), str(xds.key), str(certs.ca.cert))).start()
