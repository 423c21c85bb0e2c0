"""Generate the Envoy config variants envoy/gateway-*.yaml from envoy/gateway.yaml.

Regenerate after editing envoy/gateway.yaml (run from the repository root):

    python -m tests.e2e.gateway_variants          # rewrite the variant files
    python -m tests.e2e.gateway_variants --check  # exit 1 if a committed file is stale

Each variant is gateway.yaml with a few text edits at anchors that must occur exactly once (or
exactly once per route), so comments survive and a changed base fails loudly instead of producing
a silently wrong variant. Every edit also has a structural twin (`expected_structure`) that applies
the same change to the parsed YAML; tests/e2e/test_envoy_balancing.py checks that the committed
files equal `render()` and that the parsed text equals the structural version.

Variants:
- gateway-round-robin / -random / -ring-hash / -maglev: three backend endpoints
  (127.0.0.1:9001-9003) and that `lb_policy`; the two consistent-hashing ones also get a
  route `hash_policy` on the Envoy-set x-client-id header (api_key_auth forwarding), so a client
  cannot pick its backend by sending its own header.
- gateway-stream-done: two more routes whose descriptors use `apply_on_stream_done`:
  `/slow` (in-flight leases, rls algorithm `concurrency`) and `/download` (response bytes charged
  after the response). Exercised by tests/e2e/test_envoy_stream_done.py.
"""

from __future__ import annotations

import argparse
import copy
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
ENVOY_DIR = ROOT / "envoy"
BASE = ENVOY_DIR / "gateway.yaml"
BACKEND_PORTS = (9001, 9002, 9003)
HASH_HEADER = "x-client-id"

_LB_ANCHOR = "    lb_policy: ROUND_ROBIN\n"
_ENDPOINT_LINE = (
    "        - endpoint: {{ address: {{ socket_address: {{ address: 127.0.0.1, "
    "port_value: {port} }} }} }}\n"
)
_ROUTE_CLUSTER = re.compile(r"^(?P<indent> +)cluster: backend\n", re.MULTILINE)
_DEFAULT_ROUTE_ANCHOR = "              - name: default_api\n"


@dataclass(frozen=True)
class LbVariant:
    file: str
    policy: str
    summary: str
    cluster_lines: tuple[str, ...] = ()  # extra cluster fields after lb_policy (4-space indent)

    @property
    def hashing(self) -> bool:
        return self.policy in ("RING_HASH", "MAGLEV")


LB_VARIANTS = (
    LbVariant(
        "gateway-round-robin.yaml", "ROUND_ROBIN",
        "ROUND_ROBIN over 3 backends. Each worker thread keeps its own position, so with N\n"
        "workers the spread is only roughly even.",
    ),
    LbVariant(
        "gateway-random.yaml", "RANDOM",
        "RANDOM over 3 backends.",
    ),
    LbVariant(
        "gateway-ring-hash.yaml", "RING_HASH",
        "RING_HASH over 3 backends, keyed on the Envoy-set x-client-id (route hash_policy):\n"
        "each user sticks to one backend while the host set is unchanged.",
        ("ring_hash_lb_config:", "  minimum_ring_size: 1024", "  hash_function: XX_HASH"),
    ),
    LbVariant(
        "gateway-maglev.yaml", "MAGLEV",
        "MAGLEV over 3 backends, keyed on the Envoy-set x-client-id (route hash_policy):\n"
        "each user sticks to one backend (two users may share one).",
        ("maglev_lb_config:", "  table_size: 65537  # must be prime"),
    ),
)

STREAM_DONE_FILE = "gateway-stream-done.yaml"
STREAM_DONE_SUMMARY = (
    "gateway.yaml plus two routes whose descriptors are sent after the stream completes\n"
    "(apply_on_stream_done): /slow (in-flight limit per user, rls algorithm `concurrency`) and\n"
    "/download (response bytes charged after the response, rls `charge: always`)."
)

# Routes inserted before the catch-all default_api route (kept as YAML beside this file, at the
# indentation of a top-level list; re-indented to the base's route list).
STREAM_DONE_ROUTES_FILE = Path(__file__).with_name("stream_done_routes.yaml")
ROUTE_INDENT = " " * 14


def stream_done_routes() -> str:
    """The routes file after its header (up to the first blank line), indented for the base."""
    text = STREAM_DONE_ROUTES_FILE.read_text()
    _, sep, routes = text.partition("\n\n")
    if not sep:
        raise ValueError(f"{STREAM_DONE_ROUTES_FILE.name}: no blank line after the header")
    lines = routes.splitlines(keepends=True)
    return "".join(ROUTE_INDENT + line if line.strip() else line for line in lines)


# --------------------------------------------------------------------------- text edits


def _replace_once(text: str, old: str, new: str) -> str:
    count = text.count(old)
    if count != 1:
        raise ValueError(f"anchor {old!r} occurs {count} times in {BASE.name}, expected 1")
    return text.replace(old, new)


def _header(text: str, file: str, summary: str) -> str:
    """Replace the base's leading comment block by a generated-file header that quotes it."""
    lines = text.splitlines(keepends=True)
    n = 0
    while n < len(lines) and lines[n].startswith("#"):
        n += 1
    base_header = "".join("#   " + line[1:].lstrip(" ") for line in lines[:n])
    head = (
        f"# {file}: GENERATED from envoy/gateway.yaml by tests/e2e/gateway_variants.py.\n"
        "# Do not edit by hand: edit gateway.yaml (or the generator) and run\n"
        "#     python -m tests.e2e.gateway_variants\n"
        "# (tests/e2e/test_envoy_balancing.py fails while this file is stale).\n"
        + "".join(f"# {line}\n" for line in summary.splitlines())
        + "# Header of gateway.yaml:\n"
    )
    return head + base_header + "".join(lines[n:])


def _lb_text(base: str, variant: LbVariant) -> str:
    text = _header(base, variant.file, variant.summary)
    if variant.hashing:
        comment = (
            "    # Consistent hashing: the routes' hash_policy (header x-client-id) picks"
            " the host.\n"
        )
    else:
        comment = ""
    extra = "".join(f"    {line}\n" for line in variant.cluster_lines)
    text = _replace_once(text, _LB_ANCHOR, f"{comment}    lb_policy: {variant.policy}\n{extra}")
    endpoints = "".join(_ENDPOINT_LINE.format(port=p) for p in BACKEND_PORTS)
    text = _replace_once(text, _ENDPOINT_LINE.format(port=BACKEND_PORTS[0]), endpoints)
    if variant.hashing:
        routes = len(routes_of(yaml.safe_load(base)))
        text, count = _ROUTE_CLUSTER.subn(
            lambda m: (
                f"{m['indent']}cluster: backend\n"
                f"{m['indent']}hash_policy:\n"
                f"{m['indent']}- header: {{ header_name: {HASH_HEADER} }}\n"
            ),
            text,
        )
        if count != routes:
            raise ValueError(f"found {count} 'cluster: backend' route lines, expected {routes}")
    return text


def _stream_done_text(base: str) -> str:
    text = _header(base, STREAM_DONE_FILE, STREAM_DONE_SUMMARY)
    return _replace_once(
        text, _DEFAULT_ROUTE_ANCHOR, stream_done_routes() + _DEFAULT_ROUTE_ANCHOR
    )


def render(base_text: str | None = None) -> dict[str, str]:
    """file name -> generated text, for every variant."""
    base = BASE.read_text() if base_text is None else base_text
    out = {v.file: _lb_text(base, v) for v in LB_VARIANTS}
    out[STREAM_DONE_FILE] = _stream_done_text(base)
    return out


# --------------------------------------------------------------------------- structural twins


def routes_of(config: dict[str, Any]) -> list[dict[str, Any]]:
    hcm = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
    return hcm["typed_config"]["route_config"]["virtual_hosts"][0]["routes"]


def cluster_of(config: dict[str, Any], name: str) -> dict[str, Any]:
    (cluster,) = [c for c in config["static_resources"]["clusters"] if c["name"] == name]
    return cluster


def expected_structure(base: dict[str, Any], file: str) -> dict[str, Any]:
    """The parsed YAML a variant must have: the same edits, made on the data."""
    config = copy.deepcopy(base)
    if file == STREAM_DONE_FILE:
        routes = routes_of(config)
        at = [r["name"] for r in routes].index("default_api")
        routes[at:at] = yaml.safe_load(STREAM_DONE_ROUTES_FILE.read_text())
        return config
    (variant,) = [v for v in LB_VARIANTS if v.file == file]
    backend = cluster_of(config, "backend")
    backend["lb_policy"] = variant.policy
    backend.update(yaml.safe_load("\n".join(variant.cluster_lines)) or {})
    (locality,) = backend["load_assignment"]["endpoints"]
    (template,) = locality["lb_endpoints"]
    locality["lb_endpoints"] = []
    for port in BACKEND_PORTS:
        endpoint = copy.deepcopy(template)
        endpoint["endpoint"]["address"]["socket_address"]["port_value"] = port
        locality["lb_endpoints"].append(endpoint)
    if variant.hashing:
        for route in routes_of(config):
            route["route"]["hash_policy"] = [{"header": {"header_name": HASH_HEADER}}]
    return config


# --------------------------------------------------------------------------- command line


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report stale files")
    args = parser.parse_args(argv)
    stale = []
    for name, text in render().items():
        path = ENVOY_DIR / name
        current = path.read_text() if path.exists() else None
        if current == text:
            continue
        stale.append(name)
        if not args.check:
            path.write_text(text)
            print(f"wrote {path.relative_to(ROOT)}")
    if args.check and stale:
        print("stale: " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
