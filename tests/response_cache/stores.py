"""Real store servers for the cache tests, behind one interface: redis-server, and a real SSDB
1.9.8 whose ssdb-server binary the `SSDB_SERVER` environment variable names (built from SSDB's
source by scripts/build-ssdb.sh; docs/cache.md).

Both can be killed (SIGKILL), frozen (SIGSTOP) and restarted on the same port, so the e2e
tests inject the same faults into either. SSDB is disk-backed: a restart keeps its entries.
No fixtures here (see conftest.py).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
import uuid
from abc import ABC, abstractmethod
from pathlib import Path

import redis
from conftest import RedisServer, free_port, start_redis, wait_until
from support.processes import stop_process

SSDB_SERVER = "SSDB_SERVER"  # the environment variable: path of an ssdb-server binary
SSDB_UNSET = (
    f"needs a real SSDB: {SSDB_SERVER} is not set (the path of an ssdb-server binary; "
    "scripts/build-ssdb.sh builds one from SSDB's source, see docs/cache.md)"
)
SSDB_SAFE = {"get", "setx", "expire"}  # what rls may send in ssdb:// mode (SETEX arrives as setx)


class StoreProcess(ABC):
    """A store server the tests own: inspect keys and TTLs, inject faults, restart."""

    kind: str
    port: int
    proc: subprocess.Popen[bytes]

    @property
    @abstractmethod
    def url(self) -> str:
        """The store URL rls is given."""

    @abstractmethod
    def client(self) -> redis.Redis:
        """A test-side client (RESP2, SSDB-compatible where needed)."""

    @abstractmethod
    def keys(self, prefix: str) -> list[bytes]:
        """Live keys starting with `prefix`, sorted."""

    @abstractmethod
    def start(self) -> None:
        """(Re)start on the same port with the same data."""

    def ttl(self, key: bytes) -> int:
        return int(self.client().execute_command("TTL", key))

    def expire(self, key: bytes, seconds: int) -> None:
        self.client().execute_command("EXPIRE", key, seconds)

    def flush(self) -> None:
        self.client().execute_command("FLUSHDB")

    def freeze(self) -> None:
        os.kill(self.proc.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.thaw()
        stop_process(self.proc, 10)


class RedisStore(StoreProcess):
    """redis-server without persistence (a restart loses every entry)."""

    kind = "redis"

    def __init__(self) -> None:
        self.server: RedisServer = start_redis()
        self.port = self.server.port
        self.proc = self.server.proc

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port)

    def keys(self, prefix: str) -> list[bytes]:
        return sorted(self.client().keys(prefix + "*"))

    def start(self) -> None:
        self.server = start_redis(port=self.port)
        self.proc = self.server.proc


def ssdb_binary_setting() -> str | None:
    """`SSDB_SERVER` as given, or None when unset or empty (the SSDB tests are then skipped)."""
    return os.environ.get(SSDB_SERVER) or None


def ssdb_binary() -> str:
    """The ssdb-server `SSDB_SERVER` names; a set but unusable path is an error, not a skip.

    A binary rather than host:port of a running server, because the tests kill, freeze and
    restart their store and read its debug log.
    """
    path = ssdb_binary_setting()
    if path is None:
        raise RuntimeError(SSDB_UNSET)
    found = shutil.which(path)
    if found is None:
        raise FileNotFoundError(
            f"{SSDB_SERVER}={path}: no such executable (the path of an ssdb-server binary, "
            "as scripts/build-ssdb.sh prints it)"
        )
    return found


# SSDB's config format: `key: value`, sections indented by one TAB (spaces are not accepted).
SSDB_CONFIG = """\
work_dir = {dir}/data
pidfile = {dir}/ssdb.pid

server:
\tip: 127.0.0.1
\tport: {port}

replication:
\tbinlog: no
\tsync_speed: -1
\tslaveof:

logger:
\tlevel: debug
\toutput: {dir}/log.txt
\trotate:
\t\tsize: 1000000000

leveldb:
\tcache_size: 8
\twrite_buffer_size: 4
\tcompaction_speed: 1000
\tcompression: no
"""
# Debug level logs every request after its Redis-to-SSDB translation:
#   ... w:0.006,p:0.021, req: setx t:e:items:... 60 ..., resp: ok 1
_REQUEST = re.compile(r"\breq: ([^\s,]+)")


class SsdbStore(StoreProcess):
    """A real ssdb-server on a free port, with a temporary config, data dir and debug log."""

    kind = "ssdb"

    def __init__(self, binary: str) -> None:
        self.binary = binary
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="rls-ssdb-"))
        (self.dir / "data").mkdir()
        self.config = self.dir / "ssdb.conf"
        self.config.write_text(SSDB_CONFIG.format(dir=self.dir, port=self.port))
        self.log_path = self.dir / "log.txt"
        self.start()

    @property
    def url(self) -> str:
        return f"ssdb://127.0.0.1:{self.port}"

    def client(self) -> redis.Redis:
        # RESP2 and no CLIENT SETINFO: SSDB knows neither HELLO nor CLIENT.
        return redis.Redis(port=self.port, protocol=2, driver_info=None, socket_timeout=5)

    def start(self) -> None:
        # A killed server leaves its pidfile behind, and ssdb-server refuses to start over it.
        (self.dir / "ssdb.pid").unlink(missing_ok=True)
        self.proc = subprocess.Popen([self.binary, str(self.config)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        def up() -> bool:
            assert self.proc.poll() is None, f"ssdb-server exited:\n{self.log()[-3000:]}"
            return bool(self.client().ping())

        wait_until(up, timeout=20, what=f"ssdb-server on {self.port}")

    def keys(self, prefix: str) -> list[bytes]:
        # SSDB has no KEYS pattern: its own KEYS lists the range (start, end], up to a limit.
        raw = self.client().execute_command("KEYS", prefix, prefix + "\xff", 1_000_000)
        return sorted(raw or [])

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def _mark(self) -> tuple[int, int]:
        """Log offsets of the start and end of a fresh marker request's line.

        SSDB writes a request's log line after answering it, so a log size read right after a
        call may miss that call: a marker request that the log is polled for closes the gap.
        """
        token = f"rls-test-mark-{uuid.uuid4().hex}".encode()
        self.client().get(token)
        found: list[int] = []

        def logged() -> bool:
            data = self.log_path.read_bytes()
            at = data.find(token)
            if at >= 0:
                found[:] = [data.rfind(b"\n", 0, at) + 1, data.index(b"\n", at) + 1]
            return bool(found)

        wait_until(logged, timeout=10, what="SSDB to log a marker request")
        return found[0], found[1]

    def log_offset(self) -> int:
        """A log position after every request answered so far."""
        return self._mark()[1]

    def commands_since(self, offset: int) -> list[str]:
        """Names of the commands SSDB got after `log_offset()` returned `offset` (as SSDB names
        them after its Redis translation: SETEX is logged as setx)."""
        end = self._mark()[0]
        with open(self.log_path, "rb") as f:
            f.seek(offset)
            text = f.read(end - offset).decode(errors="replace")
        return [m.group(1).lower() for m in _REQUEST.finditer(text)]

    def stop(self) -> None:
        super().stop()

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
