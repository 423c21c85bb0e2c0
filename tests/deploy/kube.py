"""The chart rendered by a real helm, and what a kubelet would make of its rls container: the
volumes written, the environment resolved, the probes run. No cluster: the tests start the
container themselves, as a local process (test_chart.py) or in the replayed image
(test_image.py).
"""

from __future__ import annotations

import base64
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc
from support.certs import CertAuthority
from support.net import connectable, free_port, http_call

from .minihelm import deep_merge
from .runtime_stage import entrypoint_and_cmd
from .test_helm import ALL_ON, CHART

KUBERNETES = "1.30"
RELEASE, NAMESPACE = "demo", "rate-limit"  # minihelm's defaults
CLIENT_SAN = "spiffe://cluster.local/ns/gateway/sa/envoy"

# Every knob values.yaml offers, on (ALL_ON of the unit tests, plus what they leave off).
EVERYTHING: dict[str, Any] = deep_merge(ALL_ON, {
    "imagePullSecrets": [{"name": "registry"}],
    "serviceAccountName": "rls",
    "podLabels": {"tier": "edge"},
    "service": {"annotations": {"example.com/owner": "edge"}},
    "settings": {"workers": 2},
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
SMALL_LIMIT = ("domain: chart\ndescriptors:\n  - key: client\n    rate_limit:\n"
               "      unit: minute\n      requests_per_unit: 2\n")
KEY_PREFIX = "chart-test:"  # set through the envFrom ConfigMap of EVERYTHING

Objects = list[dict[str, Any]]
ClusterData = dict[tuple[str, str], dict[str, bytes]]  # (kind, name) -> {key: bytes}


def helm_run(helm: Path, *args: str, values: dict[str, Any], tmp: Path) -> str:
    """helm with `values` as a values file, its own cache and config under `tmp`."""
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


@dataclass
class Runnable:
    """A value set made runnable on this machine, and what the cluster would hold besides."""

    values: dict[str, Any]
    external: ClusterData  # the user's own Secrets and ConfigMaps the values name
    credentials: grpc.ChannelCredentials | None  # a client's, when rls serves TLS


def runnable(name: str, redis_url: str, tmp: Path) -> Runnable:
    """VALUE_SETS[name] plus what a local run needs: free ports, a small limit in a descriptor
    file of its own, the test's Redis, the user's Secrets and ConfigMap (TLS certificates for
    127.0.0.1, client certificates carrying tls.clientSan), no shadow mode."""
    values = deep_merge(VALUE_SETS[name], {
        "ports": {"grpc": free_port(), "http": free_port()},
        "descriptors": {"small.yaml": SMALL_LIMIT},
    })
    if name != "everything":
        return Runnable(values, {}, None)
    values |= {"redis": {"url": redis_url},
               "extraArgs": ["--extproc-addr", f"127.0.0.1:{free_port()}"]}
    ca = CertAuthority.create(tmp / "ca")
    server = ca.issue("rls", sans=("DNS:localhost", "IP:127.0.0.1"))
    client = ca.issue("envoy", sans=(f"URI:{CLIENT_SAN}",), client=True)
    external: ClusterData = {
        ("Secret", values["tls"]["secretName"]): {
            "tls.crt": server.cert.read_bytes(), "tls.key": server.key.read_bytes(),
            "ca.crt": ca.cert.read_bytes()},
        ("ConfigMap", "rls-extra"): {"RLS_KEY_PREFIX": KEY_PREFIX.encode()},
    }
    return Runnable(values, external,
                    grpc.ssl_channel_credentials(ca.cert.read_bytes(), *client.read()))


# --------------------------------------------------------------------------- the kubelet's part


def project(files: dict[str, bytes], directory: Path) -> None:
    """A ConfigMap or Secret volume as the kubelet writes it: the files in a timestamped
    directory, `..data` linked to it, each key a link through `..data` (mode 0644)."""
    stamp = directory / "..2026_01_01_00_00_00.000000001"
    stamp.mkdir(parents=True)
    for key, data in files.items():
        (stamp / key).write_bytes(data)
        (stamp / key).chmod(0o644)
    (directory / "..data").symlink_to(stamp.name)
    for key in files:
        (directory / key).symlink_to(f"..data/{key}")
    for path in (directory, stamp):
        path.chmod(0o755)


def cluster_data(objs: Objects, external: ClusterData) -> ClusterData:
    """Every ConfigMap and Secret: rendered, or the user's."""
    data = dict(external)
    for obj in objs:
        if obj["kind"] == "ConfigMap":
            data["ConfigMap", obj["metadata"]["name"]] = {
                k: v.encode() for k, v in obj.get("data", {}).items()}
        elif obj["kind"] == "Secret":
            data["Secret", obj["metadata"]["name"]] = {
                k: base64.b64decode(v) for k, v in obj.get("data", {}).items()}
    return data


def resolve_env(container: dict[str, Any], data: ClusterData) -> dict[str, str]:
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


@dataclass
class PodSpec:
    """The rls container of a rendered Deployment, ready to start: its volumes written on the
    host (mount path -> host directory, read-only or not), its command line and environment
    (without the image's)."""

    pod: dict[str, Any]  # the pod template's spec
    container: dict[str, Any]
    mounts: dict[str, tuple[Path, bool]]
    argv: list[str]
    env: dict[str, str]

    def port(self, ref: int | str) -> int:
        if isinstance(ref, int):
            return ref
        (number,) = [p["containerPort"] for p in self.container["ports"] if p["name"] == ref]
        return int(number)


def prepare_pod(objs: Objects, external: ClusterData, volumes_dir: Path) -> PodSpec:
    """Write the rls container's volumes under `volumes_dir`, resolve its environment, and its
    command: `command` or the image's ENTRYPOINT, then `args` or the image's CMD."""
    (deploy,) = by_kind(objs, "Deployment")
    pod = deploy["spec"]["template"]["spec"]
    (container,) = [c for c in pod["containers"] if c["name"] == "rls"]
    data = cluster_data(objs, external)
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {}
    for index, mount in enumerate(container["volumeMounts"]):
        volume = volumes[mount["name"]]
        directory = volumes_dir / f"{index}-{mount['name']}"
        if "configMap" in volume:
            project(data["ConfigMap", volume["configMap"]["name"]], directory)
        elif "secret" in volume:
            project(data["Secret", volume["secret"]["secretName"]], directory)
        else:
            assert set(volume) == {"name", "emptyDir"}, volume
            directory.mkdir(parents=True)
            directory.chmod(0o777)  # as the kubelet makes an emptyDir
        mounts[mount["mountPath"]] = (directory, bool(mount.get("readOnly", False)))
    entrypoint, cmd = entrypoint_and_cmd()
    argv = [*(container.get("command") or entrypoint),
            *(container["args"] if "args" in container else cmd)]
    return PodSpec(pod, container, mounts, argv, resolve_env(container, data))


def probe_passes(spec: PodSpec, probe: dict[str, Any]) -> bool:
    """One run of a rendered probe, as the kubelet runs it, against the pod on 127.0.0.1."""
    timeout = probe.get("timeoutSeconds", 1)
    if "httpGet" in probe:
        port = spec.port(probe["httpGet"]["port"])
        status, _ = http_call(f"http://127.0.0.1:{port}", "GET", probe["httpGet"]["path"],
                              timeout=timeout)
        return 200 <= status < 400
    if "grpc" in probe:
        with grpc.insecure_channel(f"127.0.0.1:{spec.port(probe['grpc']['port'])}") as channel:
            answer = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=probe["grpc"].get("service", "")),
                timeout=timeout)
        return bool(answer.status == health_pb2.HealthCheckResponse.SERVING)
    return connectable(spec.port(probe["tcpSocket"]["port"]))


def channel(spec: PodSpec, credentials: grpc.ChannelCredentials | None) -> grpc.Channel:
    target = f"127.0.0.1:{spec.port('grpc')}"
    if credentials is None:
        return grpc.insecure_channel(target)
    return grpc.secure_channel(target, credentials)
