"""helm/rls without a helm binary: what these tests check, and what they do not.

Checked:
- Chart.yaml is a valid v2 chart whose appVersion is the package version;
- statically, every `.Values.a.b` path written in a template exists in values.yaml, and every
  top-level value is used by some template (no dead, undocumented knobs);
- the templates are rendered by tests/deploy/minihelm.py, a small strict Go-template renderer
  for exactly the constructs the chart uses (it fails on a missing key where Helm would render
  nothing, and on any construct it does not know). Rendered with the defaults and with every
  feature on (Envoy sidecar, cache rules, Redis URL or existing Secret, admin token, HPA, PDB,
  ServiceMonitor), every manifest parses as YAML and the pieces fit together: selectors match
  pod labels, Service target ports and probe ports are named container ports, volume mounts
  have volumes and ConfigMaps, the rls args parse with rls's own CLI parser, the RLS_* env
  names are real settings, probes hit a real admin route, the descriptor ConfigMap passes
  `rls check-config`, the sidecar's Envoy config passes `envoy --mode validate` and points at
  the rls gRPC port, the pod runs as the Dockerfile's non-root user.
Not checked: Helm's own rendering (Sprig functions are re-implemented, only those used),
schema validation against a Kubernetes API server, and installing the chart.
"""

from __future__ import annotations

import base64
import json
import re
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from rls.cli.check_config import check_config
from rls.cli.main import parser
from rls.cli.serve import FLAGS, settings_from

from .helpers import ROOT
from .minihelm import TemplateError, render_chart
from .test_dockerfile import one, stages

CHART = ROOT / "helm" / "rls"
VALUES = yaml.safe_load((CHART / "values.yaml").read_text())
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())

ALL_ON: dict[str, Any] = {
    "replicaCount": 3,
    "redis": {"url": "redis://:s3cret@redis-master:6379/0"},
    "adminToken": {"value": "t0ken"},
    "cache": {"enabled": True, "rules": "rules:\n- api: translate\n  methods: [POST]\n"},
    "envoy": {"enabled": True, "args": ["--log-level", "info"]},
    "autoscaling": {"enabled": True},
    "serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}},
    "grafanaDashboard": {"enabled": True, "annotations": {"grafana_folder": "rls"}},
    "prometheusRule": {"enabled": True, "labels": {"release": "prometheus"}},
    "extraArgs": ["--shadow-mode"],
    "extraEnv": [{"name": "RLS_NEAR_LIMIT_RATIO", "value": "0.9"}],
    "podAnnotations": {"team": "edge"},
    "nodeSelector": {"kubernetes.io/os": "linux"},
}


def manifests(overrides: dict[str, Any] | None = None) -> dict[tuple[str, str], dict[str, Any]]:
    """(kind, name) -> object, for every rendered manifest."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for name, text in render_chart(CHART, overrides).items():
        if name.startswith("_") or name == "NOTES.txt":
            continue
        for doc in yaml.safe_load_all(text):
            if doc is None:
                continue
            assert {"apiVersion", "kind", "metadata"} <= set(doc), (name, doc)
            key = (doc["kind"], doc["metadata"]["name"])
            assert key not in out, f"{key} rendered twice"
            assert len(key[1]) <= 63
            out[key] = doc
    return out


def only(objs: dict[tuple[str, str], dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [o for (k, _), o in objs.items() if k == kind]
    assert len(found) == 1, (kind, list(objs))
    return found[0]


def container(deploy: dict[str, Any], name: str) -> dict[str, Any]:
    (c,) = [c for c in deploy["spec"]["template"]["spec"]["containers"] if c["name"] == name]
    return c


# --------------------------------------------------------------------------- static checks


def test_chart_yaml_is_a_valid_v2_chart():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2"
    assert chart["name"] == CHART.name == "rls"
    assert chart["type"] == "application"
    assert re.fullmatch(r"\d+\.\d+\.\d+(-[\w.]+)?", chart["version"])
    assert chart["appVersion"] == PYPROJECT["project"]["version"]


def _values_refs() -> set[str]:
    refs = set()
    for path in (CHART / "templates").iterdir():
        refs |= set(re.findall(r"\.Values((?:\.[A-Za-z0-9_]+)+)", path.read_text()))
    return {r.lstrip(".") for r in refs}


def test_every_values_path_in_the_templates_exists_in_values_yaml():
    missing = []
    for ref in sorted(_values_refs()):
        node: Any = VALUES
        for part in ref.split("."):
            if not isinstance(node, dict) or part not in node:
                missing.append(ref)
                break
            node = node[part]
    assert not missing, f"templates use values that values.yaml lacks: {missing}"


def test_every_top_level_value_is_used():
    used = {ref.split(".")[0] for ref in _values_refs()}
    assert set(VALUES) - used == set()


# --------------------------------------------------------------------------- rendering


@pytest.mark.parametrize("overrides", [None, ALL_ON], ids=["defaults", "all-on"])
def test_rendered_manifests_fit_together(overrides, tmp_path: Path, monkeypatch):
    objs = manifests(overrides)
    values = VALUES if overrides is None else {**VALUES, **overrides}
    deploy = only(objs, "Deployment")
    pod = deploy["spec"]["template"]
    selector = deploy["spec"]["selector"]["matchLabels"]
    assert selector.items() <= pod["metadata"]["labels"].items()
    service = only(objs, "Service")
    assert service["spec"]["selector"] == selector

    containers = pod["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for c in containers for p in c.get("ports", [])}
    for sp in service["spec"]["ports"]:
        assert sp["targetPort"] in ports, sp

    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    for c in containers:
        for mount in c.get("volumeMounts", []):
            assert mount["name"] in volumes, mount
    for v in volumes.values():
        if "configMap" in v:
            assert ("ConfigMap", v["configMap"]["name"]) in objs, v

    rls = container(deploy, "rls")
    env = {e["name"]: e for e in rls["env"]}
    monkeypatch.delenv("RLS_ADMIN_INSECURE", raising=False)
    monkeypatch.delenv("RLS_ADMIN_TOKEN", raising=False)
    if "RLS_ADMIN_TOKEN" in env:  # as the pod would have it (from the Secret)
        monkeypatch.setenv("RLS_ADMIN_TOKEN", "from-the-secret")
    settings = settings_from(parser().parse_args(rls["args"]))  # validates, as rls does
    mounts = {m["mountPath"]: m["name"] for m in rls["volumeMounts"]}
    (config_dir,) = settings.config
    descriptors_cm = objs[("ConfigMap", volumes[mounts[config_dir]]["configMap"]["name"])]
    assert settings.grpc_addr.endswith(f":{ports['grpc']}")
    if "RLS_ADMIN_TOKEN" in env:  # admin on the pod IP, probed over HTTP
        assert settings.http_addr == f"0.0.0.0:{ports['http']}"
        for probe in ("livenessProbe", "readinessProbe"):
            assert rls[probe]["httpGet"] == {"path": "/healthcheck", "port": "http"}
    else:  # no token: admin on loopback, probes through gRPC health
        assert settings.http_addr == f"127.0.0.1:{ports['http']}"
        for probe in ("livenessProbe", "readinessProbe"):
            assert rls[probe]["grpc"] == {"port": ports["grpc"]}
            assert "httpGet" not in rls[probe]
    known = {f"RLS_{name.upper()}" for name in FLAGS} | {"RLS_ADMIN_TOKEN", "RLS_CONFIG"}
    assert set(env) <= known, set(env) - known

    # The descriptor files pass rls check-config, as they would in the pod.
    for name, text in descriptors_cm["data"].items():
        (tmp_path / name).write_text(text)
    assert check_config([str(tmp_path)], False) == 0

    # The pod runs as the image's non-root user.
    security = pod["spec"]["securityContext"]
    uid = one("USER", stages()[-1]).split(":")[0]
    assert security["runAsNonRoot"] is True and str(security["runAsUser"]) == uid
    assert rls["securityContext"]["allowPrivilegeEscalation"] is False

    has_hpa = ("HorizontalPodAutoscaler", deploy["metadata"]["name"]) in objs
    assert has_hpa == values["autoscaling"]["enabled"]
    assert ("replicas" in deploy["spec"]) != has_hpa
    pdbs = [o for (k, _), o in objs.items() if k == "PodDisruptionBudget"]
    assert bool(pdbs) == (has_hpa or values["replicaCount"] > 1)
    for pdb in pdbs:
        assert pdb["spec"]["selector"]["matchLabels"] == selector
    for (kind, _), sm in objs.items():
        if kind == "ServiceMonitor":
            (endpoint,) = sm["spec"]["endpoints"]
            assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
            assert endpoint["path"] == "/metrics"
            assert sm["spec"]["selector"]["matchLabels"] == selector


def test_defaults_are_one_memory_backed_pod_without_secrets_or_sidecar():
    objs = manifests()
    deploy = only(objs, "Deployment")
    assert [c["name"] for c in deploy["spec"]["template"]["spec"]["containers"]] == ["rls"]
    assert not [k for k in objs if k[0] in ("Secret", "HorizontalPodAutoscaler",
                                            "ServiceMonitor", "PodDisruptionBudget")]
    env = {e["name"] for e in container(deploy, "rls")["env"]}
    assert "RLS_REDIS_URL" not in env and "RLS_ADMIN_TOKEN" not in env
    resources = container(deploy, "rls")["resources"]
    assert resources["requests"]["cpu"] and resources["limits"]["memory"]


def test_admin_is_closed_by_default():
    """No token: the admin listener stays on loopback, and a ServiceMonitor (which would need
    /metrics on the pod IP) is refused with a message saying why."""
    rls = container(only(manifests(), "Deployment"), "rls")
    args = rls["args"]
    assert args[args.index("--http-addr") + 1].startswith("127.0.0.1:")
    with pytest.raises(TemplateError, match=r"serviceMonitor\.enabled needs adminToken"):
        render_chart(CHART, {"serviceMonitor": {"enabled": True}})
    monitored = manifests({"serviceMonitor": {"enabled": True},
                           "adminToken": {"existingSecret": "ops-token"}})
    rls = container(only(monitored, "Deployment"), "rls")
    assert rls["args"][rls["args"].index("--http-addr") + 1].startswith("0.0.0.0:")


def test_secrets_redis_url_and_admin_token():
    objs = manifests(ALL_ON)
    secret = only(objs, "Secret")
    deploy = only(objs, "Deployment")
    env = {e["name"]: e for e in container(deploy, "rls")["env"]}
    for var, expected in (("RLS_REDIS_URL", ALL_ON["redis"]["url"]),
                          ("RLS_ADMIN_TOKEN", ALL_ON["adminToken"]["value"])):
        ref = env[var]["valueFrom"]["secretKeyRef"]
        assert ref["name"] == secret["metadata"]["name"]
        assert base64.b64decode(secret["data"][ref["key"]]).decode() == expected

    existing = manifests({"redis": {"existingSecret": "shared-redis"},
                          "adminToken": {"existingSecret": "ops-token"}})
    assert not [k for k in existing if k[0] == "Secret"]
    env = {e["name"]: e for e in container(only(existing, "Deployment"), "rls")["env"]}
    assert env["RLS_REDIS_URL"]["valueFrom"]["secretKeyRef"] == {
        "name": "shared-redis", "key": VALUES["redis"]["existingSecretKey"]}
    assert env["RLS_ADMIN_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "ops-token"


def test_cache_rules_are_mounted_and_passed():
    objs = manifests(ALL_ON)
    rls = container(only(objs, "Deployment"), "rls")
    args = rls["args"]
    path = args[args.index("--cache-config") + 1]
    assert any(path.startswith(m["mountPath"] + "/") for m in rls["volumeMounts"])
    cache = objs[("ConfigMap", "demo-rls-cache")]
    assert cache["data"][Path(path).name] == ALL_ON["cache"]["rules"]
    with pytest.raises(TemplateError, match=r"cache\.rules is required"):
        render_chart(CHART, {"cache": {"enabled": True, "rules": ""}})


@pytest.mark.envoy
def test_envoy_sidecar_config_is_valid_and_calls_rls_on_loopback(tmp_path: Path):
    from rls.demo import find_envoy

    objs = manifests(ALL_ON)
    deploy = only(objs, "Deployment")
    envoy = container(deploy, "envoy")
    assert envoy["image"] == "envoyproxy/envoy:v1.40.0"
    args = envoy["args"]
    config_path = Path(args[args.index("--config-path") + 1])
    mount = {m["mountPath"]: m["name"] for m in envoy["volumeMounts"]}[str(config_path.parent)]
    volume = {v["name"]: v for v in deploy["spec"]["template"]["spec"]["volumes"]}[mount]
    text = objs[("ConfigMap", volume["configMap"]["name"])]["data"][config_path.name]
    config = yaml.safe_load(text)
    clusters = {c["name"]: c for c in config["static_resources"]["clusters"]}
    rl = clusters["ratelimit_service"]["load_assignment"]["endpoints"][0]["lb_endpoints"][0]
    address = rl["endpoint"]["address"]["socket_address"]
    assert (address["address"], address["port_value"]) == ("127.0.0.1", VALUES["ports"]["grpc"])
    listener = config["static_resources"]["listeners"][0]["address"]["socket_address"]
    assert listener["port_value"] == VALUES["envoy"]["listenerPort"] == envoy["ports"][0][
        "containerPort"]
    (tmp_path / "envoy.yaml").write_text(text)
    done = subprocess.run([find_envoy(), "--mode", "validate", "-c", str(tmp_path / "envoy.yaml")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_notes_render_and_warn_about_memory_counters_with_several_pods():
    notes = render_chart(CHART, {"replicaCount": 3})["NOTES.txt"]
    assert "demo-rls.rate-limit.svc:8081" in notes
    assert "WARNING" in notes
    assert "WARNING" not in render_chart(CHART, ALL_ON)["NOTES.txt"]
    assert "WARNING" not in render_chart(CHART)["NOTES.txt"]


def test_dashboard_and_alert_rules_render_only_when_enabled():
    defaults = manifests()
    assert not [k for k in defaults if k[0] == "PrometheusRule"]
    assert not [k for k in defaults if k[0] == "ConfigMap" and k[1].endswith("-dashboard")]
    objs = manifests(ALL_ON)

    dashboard = objs[("ConfigMap", "demo-rls-dashboard")]
    labels = dashboard["metadata"]["labels"]
    assert labels["grafana_dashboard"] == "1"  # the Grafana sidecar's label, a string
    assert dashboard["metadata"]["annotations"] == {"grafana_folder": "rls"}
    (text,) = dashboard["data"].values()
    shipped = json.loads((CHART / "files" / "grafana-dashboard.json").read_text())
    assert json.loads(text) == shipped

    rule = only(objs, "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["labels"]["release"] == "prometheus"
    plain = yaml.safe_load((CHART / "files" / "prometheus-rules.yaml").read_text())
    assert rule["spec"] == plain  # the plain rules file, embedded unchanged
    assert {r["alert"] for g in rule["spec"]["groups"] for r in g["rules"]} == {
        "RlsFailureModeAnswers", "RlsStoreUnreachable", "RlsConfigReloadFailing",
        "RlsDecisionLatencyOverBudget", "RlsCacheStoreDown", "RlsLimitNearCeiling",
    }


def test_minihelm_files_get_fails_on_a_missing_file(tmp_path: Path):
    (tmp_path / "templates").mkdir()
    (tmp_path / "Chart.yaml").write_text("apiVersion: v2\nname: t\nversion: 0.1.0\n")
    (tmp_path / "values.yaml").write_text("{}\n")
    (tmp_path / "files").mkdir()
    (tmp_path / "files" / "a.txt").write_text("hello")
    template = tmp_path / "templates" / "x.yaml"
    template.write_text('x: {{ .Files.Get "files/a.txt" | quote }}\n')
    assert render_chart(tmp_path)["x.yaml"] == 'x: "hello"\n'
    template.write_text('x: {{ .Files.Get "files/missing.txt" }}\n')
    with pytest.raises(TemplateError, match="no file"):
        render_chart(tmp_path)


def test_minihelm_is_strict(tmp_path: Path):
    """The renderer refuses what Helm would silently render as empty, and constructs it
    does not implement, so a passing render means something."""
    (tmp_path / "templates").mkdir()
    (tmp_path / "Chart.yaml").write_text("apiVersion: v2\nname: t\nversion: 0.1.0\n")
    (tmp_path / "values.yaml").write_text("a: {b: 1}\n")
    template = tmp_path / "templates" / "x.yaml"
    template.write_text("x: {{ .Values.a.b }}{{- if .Values.a.b }} y{{ end }}\n")
    assert render_chart(tmp_path)["x.yaml"] == "x: 1 y\n"
    template.write_text("x: {{ .Values.a.typo }}\n")
    with pytest.raises(TemplateError, match="no key 'typo'"):
        render_chart(tmp_path)
    template.write_text("x: {{ lookup \"v1\" \"Secret\" \"ns\" \"s\" }}\n")
    with pytest.raises(TemplateError, match="unknown function 'lookup'"):
        render_chart(tmp_path)
