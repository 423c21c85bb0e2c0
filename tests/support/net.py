"""Ports for the servers the tests start: always free ones, never a fixed port."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A loopback port nobody listens on right now (the kernel picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def connectable(port: int, host: str = "127.0.0.1") -> bool:
    """Something accepts TCP connections on host:port."""
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0
