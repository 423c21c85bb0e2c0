"""Real Redis topologies on free loopback ports: Cluster, Sentinel, AUTH/ACL, TLS.

Every process logs to a file in its topology's work directory (shown when a wait times out) and
is stopped by `Topology.stop()`, which the fixtures call from their finalizers. Nothing here
touches the machine's own Redis on 6379.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from support.net import free_port
from support.redis_server import redis_server_binary
from support.waiting import wait_until

# Generous but bounded: a topology that does not come up within this fails the test loudly.
START_TIMEOUT = 20.0


def free_cluster_port() -> int:
    """A free port P whose cluster bus port P + 10000 is free too."""
    for _ in range(200):
        port = free_port()
        if port + 10000 > 65535:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port pair (P, P + 10000) for a cluster node")


@dataclass
class Proc:
    """One redis-server (or sentinel) process."""

    name: str
    port: int
    proc: subprocess.Popen[bytes]
    log_path: Path
    client_kwargs: dict[str, Any] = field(default_factory=dict)
    _clients: dict[tuple[Any, ...], redis.Redis] = field(default_factory=dict, repr=False)

    def client(self, **kwargs: Any) -> redis.Redis:
        """A (cached) client of this server; it reconnects by itself after a failure."""
        options = {**self.client_kwargs, **kwargs}
        key = tuple(sorted(options.items()))
        if key not in self._clients:
            self._clients[key] = redis.Redis(
                host="127.0.0.1", port=self.port, socket_timeout=2, socket_connect_timeout=2,
                **options,
            )
        return self._clients[key]

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def kill(self) -> None:
        """SIGKILL: no shutdown, no final save, connections reset."""
        if self.alive():
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(5)

    def stop(self) -> None:
        for client in self._clients.values():
            with contextlib.suppress(Exception):
                client.close()
        self._clients.clear()
        if self.alive():
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def launch(
    workdir: Path, name: str, port: int, args: Sequence[str], *, sentinel_conf: Path | None = None
) -> Proc:
    """Start redis-server on 127.0.0.1:port with `args`; stdout/stderr go to <name>.log."""
    cmd = [redis_server_binary()]
    if sentinel_conf is not None:
        cmd += [str(sentinel_conf), "--sentinel"]
    else:
        cmd += [
            "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
            "--dir", str(workdir),
        ]
    cmd += list(args)
    log_path = workdir / f"{name}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=str(workdir))
    return Proc(name, port, proc, log_path)


def wait_for(procs: Sequence[Proc], predicate: Callable[[], bool], what: str,
             timeout: float = START_TIMEOUT) -> None:
    """`wait_until` that fails at once when one of `procs` exits, with their logs."""
    wait_until(
        predicate, timeout, what,
        alive=lambda: all(p.alive() for p in procs),
        log=lambda: "\n".join(
            f"--- {p.name} (port {p.port}) ---\n{p.log()[-3000:]}" for p in procs
        ),
    )


def _as_map(raw: Any) -> dict[str, str]:
    """INFO / CLUSTER INFO as {field: text}, whether redis-py parsed it or not."""
    if isinstance(raw, dict):
        return {_s(k): _s(v) for k, v in raw.items()}
    text = _s(raw)
    return dict(
        (k.strip(), v.strip())
        for k, _, v in (line.partition(":") for line in text.splitlines())
        if v
    )


def _info(proc: Proc, section: str) -> dict[str, str]:
    return _as_map(proc.client().execute_command("INFO", section))


class Topology:
    """A set of processes stopped together."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.procs: list[Proc] = []

    def add(self, proc: Proc) -> Proc:
        self.procs.append(proc)
        return proc

    def stop(self) -> None:
        for proc in self.procs:
            with contextlib.suppress(Exception):
                proc.stop()

    def logs(self) -> str:
        return "\n".join(f"--- {p.name} ---\n{p.log()[-3000:]}" for p in self.procs)


# -- Cluster --------------------------------------------------------------------------------


class ClusterTopology(Topology):
    masters: list[Proc]

    @property
    def url(self) -> str:
        seeds = ",".join(f"127.0.0.1:{p.port}" for p in self.masters[:2])
        return f"redis+cluster://{seeds}"

    def flush(self) -> None:
        for node in self.masters:
            node.client().flushall()

    def slot_owner(self, key: str) -> Proc:
        """The master serving `key`'s slot, from CLUSTER SLOTS."""
        slot = redis.cluster.key_slot(key.encode())
        for start, end, master, *_ in self.masters[0].client().execute_command("CLUSTER SLOTS"):
            if int(start) <= slot <= int(end):
                port = int(master[1])
                return next(p for p in self.masters if p.port == port)
        raise AssertionError(f"slot {slot} of {key!r} is not served")

    def keys_by_node(self) -> dict[int, list[str]]:
        return {
            node.port: sorted(k.decode() for k in node.client().keys("*"))
            for node in self.masters
        }


def start_cluster(workdir: Path, masters: int = 3, replicas: int = 0) -> ClusterTopology:
    """`masters` masters (each with `replicas` replicas) joined with redis-cli --cluster create."""
    topo = ClusterTopology(workdir)
    try:
        ports = []
        while len(ports) < masters * (1 + replicas):
            port = free_cluster_port()
            if port not in ports:
                ports.append(port)
        for port in ports:
            topo.add(launch(workdir, f"cluster-{port}", port, [
                "--cluster-enabled", "yes",
                "--cluster-config-file", str(workdir / f"nodes-{port}.conf"),
                "--cluster-node-timeout", "2000",
            ]))
        wait_for(topo.procs, lambda: all(p.client().ping() for p in topo.procs),
                 "cluster nodes answer PING")
        create = subprocess.run(
            ["redis-cli", "--cluster", "create", *(f"127.0.0.1:{p}" for p in ports),
             "--cluster-replicas", str(replicas), "--cluster-yes"],
            capture_output=True, text=True, timeout=60,
        )
        if create.returncode != 0:
            raise AssertionError(f"redis-cli --cluster create failed:\n{create.stdout}\n"
                                 f"{create.stderr}\n{topo.logs()}")

        def ok() -> bool:
            for p in topo.procs:
                info = _cluster_info(p)
                if (info.get("cluster_state") != "ok"
                        or info.get("cluster_slots_ok") != "16384"
                        or info.get("cluster_known_nodes") != str(len(ports))):
                    return False
            return True

        wait_for(topo.procs, ok, "cluster_state:ok with all slots on every node")
        master_ports = {
            int(m[2][1]) for m in topo.procs[0].client().execute_command("CLUSTER SLOTS")
        }
        topo.masters = [p for p in topo.procs if p.port in master_ports]
        if replicas:
            wait_for(topo.procs, lambda: all(
                _info(p, "replication").get("master_link_status") == "up"
                for p in topo.procs if p.port not in master_ports
            ), "cluster replicas in sync")
        return topo
    except BaseException:
        topo.stop()
        raise


def _cluster_info(proc: Proc) -> dict[str, str]:
    return _as_map(proc.client().execute_command("CLUSTER INFO"))


# -- Sentinel -------------------------------------------------------------------------------


SERVICE = "mymaster"


class SentinelTopology(Topology):
    primary: Proc
    replica: Proc
    sentinels: list[Proc]

    def url(self, db: int = 0, auth: str = "") -> str:
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{auth}{hosts}/{SERVICE}/{db}"

    def master_port(self, sentinel: Proc | None = None) -> int:
        addr = (sentinel or self.sentinels[0]).client().execute_command(
            "SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE
        )
        return int(addr[1])

    def sentinel_view(self, sentinel: Proc) -> dict[str, str]:
        flat = sentinel.client().execute_command("SENTINEL", "MASTER", SERVICE)
        if isinstance(flat, dict):
            return {_s(k): _s(v) for k, v in flat.items()}
        return {_s(k): _s(v) for k, v in zip(flat[::2], flat[1::2], strict=True)}

    def ready_for_failover(self) -> bool:
        """Every sentinel knows the other two and the replica, and the replica is in sync."""
        for s in self.sentinels:
            view = self.sentinel_view(s)
            if view.get("num-other-sentinels") != "2" or view.get("num-slaves") != "1":
                return False
            if view.get("flags") != "master":
                return False
        return _info(self.replica, "replication").get("master_link_status") == "up"


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def start_sentinel(workdir: Path) -> SentinelTopology:
    """One primary, one replica (--replicaof), three sentinels with quorum 2."""
    topo = SentinelTopology(workdir)
    try:
        primary_port, replica_port = free_port(), free_port()
        # No diskless-sync delay: the replica's first sync would otherwise wait 5 s.
        topo.primary = topo.add(launch(workdir, "primary", primary_port, [
            "--repl-diskless-sync-delay", "0",
        ]))
        topo.replica = topo.add(launch(workdir, "replica", replica_port, [
            "--replicaof", "127.0.0.1", str(primary_port),
        ]))
        wait_for(topo.procs, lambda: _info(topo.replica, "replication").get(
            "master_link_status") == "up", "replica linked to primary")
        topo.sentinels = []
        for i in range(3):
            port = free_port()
            conf = workdir / f"sentinel-{i}.conf"
            conf.write_text(
                f"port {port}\n"
                "bind 127.0.0.1\n"
                f"dir {workdir}\n"
                "sentinel resolve-hostnames no\n"
                f"sentinel monitor {SERVICE} 127.0.0.1 {primary_port} 2\n"
                f"sentinel down-after-milliseconds {SERVICE} 1000\n"
                f"sentinel failover-timeout {SERVICE} 3000\n"
                f"sentinel parallel-syncs {SERVICE} 1\n"
            )
            topo.sentinels.append(
                topo.add(launch(workdir, f"sentinel-{i}", port, [], sentinel_conf=conf))
            )
        wait_for(topo.procs, lambda: all(
            topo.master_port(s) == primary_port for s in topo.sentinels
        ), "sentinels monitor the primary")
        return topo
    except BaseException:
        topo.stop()
        raise


# -- AUTH / ACL -----------------------------------------------------------------------------


@dataclass
class AuthSetup:
    proc: Proc
    default_password: str
    user: str
    user_password: str


def start_auth_redis(workdir: Path, topo: Topology, default_password: str, user: str,
                     user_password: str) -> AuthSetup:
    """requirepass for the default user plus an ACL user with all permissions."""
    port = free_port()
    proc = topo.add(launch(workdir, "auth", port, [
        "--requirepass", default_password,
        "--user", user, "on", f">{user_password}", "~*", "&*", "+@all",
    ]))
    proc.client_kwargs = {"password": default_password}
    wait_for([proc], lambda: proc.client().ping(), "redis-server with requirepass")
    return AuthSetup(proc, default_password, user, user_password)


# -- TLS ------------------------------------------------------------------------------------


@dataclass
class TlsFiles:
    ca: Path  # signed the server certificate
    cert: Path
    key: Path
    other_ca: Path  # a CA that did not sign it (verification must fail)


def _openssl(*args: str, cwd: Path) -> None:
    done = subprocess.run(["openssl", *args], cwd=str(cwd), capture_output=True, text=True,
                          timeout=60)
    if done.returncode != 0:
        raise AssertionError(f"openssl {' '.join(args)} failed:\n{done.stderr}")


# P-256 keys: generated in milliseconds (RSA key generation is slow on a busy machine).
EC_KEY = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1")


def make_tls_files(workdir: Path) -> TlsFiles:
    """A CA, a server certificate for 127.0.0.1/localhost signed by it, and an unrelated CA."""
    for name in ("ca", "other-ca"):
        _openssl("req", "-x509", *EC_KEY, "-nodes", "-days", "2",
                 "-keyout", f"{name}.key", "-out", f"{name}.crt", "-subj", f"/CN=rls test {name}",
                 cwd=workdir)
    _openssl("req", *EC_KEY, "-nodes", "-keyout", "server.key",
             "-out", "server.csr", "-subj", "/CN=127.0.0.1", cwd=workdir)
    (workdir / "san.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
             "-CAcreateserial", "-days", "2", "-out", "server.crt", "-extfile", "san.cnf",
             cwd=workdir)
    for name in ("server.key", "ca.key", "other-ca.key"):
        os.chmod(workdir / name, 0o600)
    return TlsFiles(workdir / "ca.crt", workdir / "server.crt", workdir / "server.key",
                    workdir / "other-ca.crt")


@dataclass
class ClientCert:
    cert: Path  # signed by TlsFiles.ca, for client authentication
    key: Path


def make_client_cert(workdir: Path, tls: TlsFiles) -> ClientCert:
    """A client certificate signed by the CA of `tls` (its key lies beside its certificate)."""
    ca_key = tls.ca.with_suffix(".key")
    _openssl("req", *EC_KEY, "-nodes", "-keyout", "client.key", "-out", "client.csr",
             "-subj", "/CN=rls test client", cwd=workdir)
    (workdir / "client.cnf").write_text("extendedKeyUsage=clientAuth\n")
    _openssl("x509", "-req", "-in", "client.csr", "-CA", str(tls.ca), "-CAkey", str(ca_key),
             "-CAcreateserial", "-days", "2", "-out", "client.crt", "-extfile", "client.cnf",
             cwd=workdir)
    os.chmod(workdir / "client.key", 0o600)
    return ClientCert(workdir / "client.crt", workdir / "client.key")


def start_tls_redis(workdir: Path, topo: Topology, tls: TlsFiles,
                    client: ClientCert | None = None) -> Proc:
    """redis-server listening only on a TLS port; with `client`, it requires a client
    certificate signed by its CA (`--tls-auth-clients yes`), else none.

    Fails (never skips) when the installed redis-server was built without TLS.
    """
    port = free_port()
    proc = topo.add(launch(workdir, "tls", port, [
        "--port", "0", "--tls-port", str(port),
        "--tls-cert-file", str(tls.cert), "--tls-key-file", str(tls.key),
        "--tls-ca-cert-file", str(tls.ca), "--tls-auth-clients", "yes" if client else "no",
    ]))
    proc.client_kwargs = {"ssl": True, "ssl_ca_certs": str(tls.ca)}
    if client is not None:
        proc.client_kwargs.update(ssl_certfile=str(client.cert), ssl_keyfile=str(client.key))
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if not proc.alive():
            log = proc.log()
            version = subprocess.run([redis_server_binary(), "--version"], capture_output=True,
                                     text=True).stdout.strip()
            raise AssertionError(
                "the installed redis-server cannot serve TLS (built without TLS support?); "
                f"{version}\n{log}"
            )
        with contextlib.suppress(redis.RedisError, OSError):
            if proc.client().ping():
                return proc
        time.sleep(0.02)
    raise AssertionError(f"TLS redis-server did not answer PING over TLS:\n{proc.log()}")
