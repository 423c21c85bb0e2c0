"""docs/ stays in step with the code it describes (the code keeps changing under it).

- configuration.md names every `rls serve` flag with its RLS_* variable (and the reference's
  variable where rls reads one), every descriptor key the parser accepts, every algorithm;
- metrics.md names every metric the service and the cache define;
- admin.md names every admin route (the cache routes included);
- envoy.md cites every config in envoy/, and every envoy/ file it cites exists;
- relative links between docs (and to repository files) resolve.
"""

from __future__ import annotations

import re

import pytest
from conftest import ROOT
from prometheus_client import CollectorRegistry

from rls.cli.serve import FLAGS
from rls.config.model import ALGORITHMS
from rls.config.parser import EXTENSION_KEYS, REFERENCE_KEYS
from rls.settings.environment import REFERENCE_ENV

DOCS = ROOT / "docs"
OWN = ["configuration.md", "envoy.md", "metrics.md", "migration.md", "admin.md",
       "envoy-gateway.md"]


def text(name: str) -> str:
    return (DOCS / name).read_text(encoding="utf-8")


def test_configuration_covers_every_flag_key_and_algorithm():
    doc = text("configuration.md")
    missing = []
    for name in FLAGS:
        for needle in (f"`--{name.replace('_', '-')}`", f"`RLS_{name.upper()}`"):
            if needle not in doc:
                missing.append(needle)
        if name in REFERENCE_ENV and f"`{REFERENCE_ENV[name]}`" not in doc:
            missing.append(REFERENCE_ENV[name])
    for key in sorted(REFERENCE_KEYS | EXTENSION_KEYS):
        if f"`{key}`" not in doc:
            missing.append(key)
    for algorithm in ALGORITHMS:
        if f"`{algorithm}`" not in doc:
            missing.append(algorithm)
    for var in ("RLS_ADMIN_TOKEN", "RLS_ADMIN_URL", "RLS_CONFIG"):
        if var not in doc:
            missing.append(var)
    assert not missing, f"docs/configuration.md lacks {missing}"


def _metric_names() -> set[str]:
    from rls.observability.metrics import Metrics

    names = set()
    registries = [Metrics().registry]
    try:
        from rls.response_cache.metrics import CacheMetrics
    except ImportError:  # the cache may be absent from a build
        pass
    else:
        registries.append(CacheMetrics(CollectorRegistry()).registry)
    from rls.config.xds.client import XdsMetrics

    xds_registry = CollectorRegistry()
    XdsMetrics(xds_registry)
    registries.append(xds_registry)
    from rls.grpc_access.token_auth import interceptors

    token_registry = CollectorRegistry()  # the token's counter exists only with a token
    interceptors("a-token", token_registry)
    registries.append(token_registry)
    for registry in registries:
        for family in registry.collect():
            suffix = "_total" if family.type == "counter" else ""
            names.add(family.name + suffix)
    return names


def test_metrics_doc_covers_every_metric():
    doc = text("metrics.md")
    names = _metric_names()
    assert "rls_requests_total" in names
    missing = sorted(n for n in names if f"`{n}`" not in doc)
    assert not missing, f"docs/metrics.md lacks {missing}"


@pytest.mark.filterwarnings("ignore::aiohttp.web_exceptions.NotAppKeyWarning")
def test_admin_doc_covers_every_route():
    from aiohttp import web

    from rls.admin.app import AdminState, create_app
    from rls.process.server import build_app
    from rls.settings import Settings

    app = build_app(Settings())
    admin = create_app(AdminState(app.service, app.metrics, app.holder.current))
    routes = {(r.method, r.resource.canonical) for r in admin.router.routes()
              if r.resource is not None}
    try:
        from rls.admin import cache as cache_admin
    except ImportError:
        pass
    else:
        extra = web.Application()
        extra.router.add_post("/cache/purge", cache_admin.purge)
        extra.router.add_get("/cache/stats", cache_admin.stats)
        routes |= {(r.method, r.resource.canonical) for r in extra.router.routes()
                   if r.resource is not None}
        source = (ROOT / "rls" / "admin" / "cache.py").read_text()
        assert set(re.findall(r'add_(?:get|post)\("([^"]+)"', source)) == {"/cache/purge",
                                                                          "/cache/stats"}
    doc = text("admin.md")
    missing = []
    for method, path in sorted(routes):
        if method == "HEAD":
            continue
        shown = path if method == "*" else f"{method} {path}"
        if f"`{shown}" not in doc and not (method == "*" and f" {path}`" in doc):
            missing.append(shown)
    assert not missing, f"docs/admin.md lacks {missing}"


def test_envoy_doc_cites_every_config_and_only_real_ones():
    doc = text("envoy.md")
    cited = set(re.findall(r"envoy/([\w.-]+\.yaml)", doc))
    on_disk = {p.name for p in (ROOT / "envoy").glob("*.yaml")}
    assert cited <= on_disk, cited - on_disk
    for name in on_disk:
        stem = name.removesuffix(".yaml")
        assert name in doc or f"-{stem.split('-')[-1]}" in doc, f"envoy.md does not cite {name}"


@pytest.mark.parametrize("name", OWN)
def test_relative_links_resolve(name):
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text(name)):
        if "://" in target:
            continue
        assert (DOCS / target).resolve().exists(), f"{name}: broken link {target}"
