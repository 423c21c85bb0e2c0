"""A real redis-server on a free loopback port (scripts/install-test-deps.sh installs it)."""

from __future__ import annotations

import subprocess
import tempfile
from dataclasses import dataclass, field

import redis

from support.net import free_port
from support.processes import stop_process
from support.system import require_binary
from support.waiting import wait_until


def redis_server_binary() -> str:
    return require_binary("redis-server", "redis-server")


@dataclass
class RedisServer:
    port: int
    proc: subprocess.Popen[bytes]
    dir: str
    args: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port)

    def stop(self) -> None:
        stop_process(self.proc, 5)


def start_redis(*extra: str, port: int | None = None) -> RedisServer:
    port = port or free_port()
    workdir = tempfile.mkdtemp(prefix="rls-redis-")
    args = [
        redis_server_binary(),
        "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
        "--dir", workdir, *extra,
    ]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    server = RedisServer(port, proc, workdir, list(extra))
    wait_until(lambda: server.client().ping(), what=f"redis-server on {port}")
    return server
