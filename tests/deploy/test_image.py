"""The image, built from the Dockerfile without a Docker engine, started the way Envoy Gateway
starts it.

The runtime stage is replayed on a Debian root filesystem (tests/deploy/image.py: debootstrap
of the base image's suite, the wheel of this repository and its dependencies installed by the
Dockerfile's own RUN). The container is then `/bin/ratelimit` with no arguments and only its
environment (the image's ENV and Envoy Gateway's variables), as uid/gid 65534, chrooted into
that root made read-only, with EG's Secret mounted at /certs (tests/deploy/container.py). Two
things are relocated so that the test runs beside others on one machine: the listeners get
free ports (GRPC_PORT, PORT, PROMETHEUS_ADDR) and REDIS_URL is the test's redis-server.
The image's own default (`docker run`) and the chart's rls container run in it too.

Cold, debootstrap and the dependency wheels add about 3.5 minutes, once (both cached,
tests/deploy/cache.py); warm, the image is built in about 40 s (the wheel, the unpacking, the
Dockerfile's RUN) and the tests take half a minute more.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from dropin.helpers import EG_ENV, Ports, Ratelimit, decide, eg_certificates, grpc_channel
from envoy.service.ratelimit.v3 import rls_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from support.net import free_port
from support.processes import stop_process
from support.redis_server import RedisServer
from support.system import require_binary
from support.waiting import wait_until

from .cache import helm_binary
from .container import Bind, beside, contained, host_can_contain
from .helpers import avoid_window_edge
from .image import Image, build_image
from .kube import KEY_PREFIX, channel, prepare_pod, probe_passes, runnable, template

OK = rls_pb2.RateLimitResponse.OK
OVER = rls_pb2.RateLimitResponse.OVER_LIMIT
NOBODY = 65534  # EG's runAsUser and runAsGroup
# What a process that failed to write to its read-only root (or anywhere it may not) logs.
LOG_PROBLEMS = re.compile(r"Read-only file system|Errno 30|Permission denied|Traceback")

why_not = host_can_contain()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(why_not is not None, reason=f"the image test {why_not}"),
]


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Image]:
    """The image, built in a tmpfs: unpacking and removing its ~20,000 files cost nothing."""
    scratch = tmp_path_factory.mktemp("image")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3g,mode=700", "rls-image", str(scratch)],
                   check=True, timeout=30)
    try:
        yield build_image(scratch / "build")
    finally:
        subprocess.run(["umount", "--lazy", str(scratch)], check=True, timeout=60)


def home_of(image: Image, uid: int) -> str:
    """HOME as the runtime sets it for a uid: its home in the image's /etc/passwd."""
    for line in (image.root / "etc/passwd").read_text().splitlines():
        fields = line.split(":")
        if int(fields[2]) == uid:
            return fields[5]
    return "/"


def eg_container_env(image: Image, config_type: str, redis: RedisServer) -> tuple[dict[str, str],
                                                                                   Ports]:
    """The container's environment under EG: the image's ENV, then EG's variables."""
    ports = Ports(free_port(), free_port(), free_port())
    env = {**image.env, "HOME": home_of(image, NOBODY), **EG_ENV,
           "CONFIG_TYPE": config_type, "REDIS_URL": f"127.0.0.1:{redis.port}",
           "GRPC_PORT": str(ports.grpc), "PORT": str(ports.http),
           "PROMETHEUS_ADDR": f":{ports.prometheus}"}
    return env, ports


def start(image: Image, env: dict[str, str], ports: Ports, binds: list[Bind],
          log_dir: Path) -> Ratelimit:
    """EG's `Command: ["/bin/ratelimit"]`, no arguments, as 65534 on the read-only root."""
    command = contained(image.root, ["/bin/ratelimit"], env, user=NOBODY, read_only_root=True,
                        binds=binds)
    log_path = log_dir / "ratelimit.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    rl = Ratelimit(proc, log_path, ports)
    wait_until(rl.healthy, timeout=60, what="/bin/ratelimit /healthcheck", log=rl.log,
               alive=lambda: proc.poll() is None)
    status = Path(f"/proc/{proc.pid}/status").read_text()
    assert f"Uid:\t{NOBODY}\t" in status and f"Gid:\t{NOBODY}\t" in status, status
    return rl


def stop_and_check_log(rl: Ratelimit) -> None:
    """SIGTERM ends it with 0, and nothing in its log says a write failed."""
    assert rl.stop() == 0, rl.log()
    assert not LOG_PROBLEMS.search(rl.log()), rl.log()


def test_the_replayed_root_is_read_only_to_the_container(image: Image):
    """The harness's own check: a write to the root fails there (even as root), and works
    when the root is left writable, so a clean run below means nothing was written."""
    probe = ["/opt/rls/bin/python", "-c", "open('/written-by-the-container', 'w')"]
    denied = subprocess.run(contained(image.root, probe, image.env, read_only_root=True),
                            capture_output=True, text=True, timeout=60)
    assert denied.returncode != 0 and "Read-only file system" in denied.stderr, denied.stderr
    assert not (image.root / "written-by-the-container").exists()
    allowed = subprocess.run(contained(image.root, probe, image.env),
                             capture_output=True, text=True, timeout=60)
    assert allowed.returncode == 0, allowed.stderr
    (image.root / "written-by-the-container").unlink()


@pytest.mark.parametrize("workers", [1, 2])
def test_file_mode_decides_as_envoy_gateway_starts_the_image(
    image: Image, redis_server: RedisServer, tmp_path: Path, workers: int,
):
    """RUNTIME_ROOT=/data with the config where the reference looks for it
    (/data/ratelimit/config/), TLS from EG's Secret at /certs: OK, OK, then OVER_LIMIT. Also
    with RLS_WORKERS=2 added (rateLimitDeployment.container.env): the workers' shared
    directory must find a writable place on the read-only root."""
    redis_server.client().flushall()
    assert image.exposed >= {8081}  # EG's container port `grpc`
    pki = eg_certificates(tmp_path)
    data = tmp_path / "data"
    (data / "ratelimit/config").mkdir(parents=True)
    (data / "ratelimit/config/limits.yaml").write_text(
        "domain: eg\ndescriptors:\n  - key: client\n    rate_limit:\n"
        "      unit: minute\n      requests_per_unit: 2\n")
    for path in (data, data / "ratelimit", data / "ratelimit/config"):
        path.chmod(0o755)
    env, ports = eg_container_env(image, "FILE", redis_server)
    assert env["RUNTIME_ROOT"] == "/data"
    if workers > 1:
        env["RLS_WORKERS"] = str(workers)
    rl = start(image, env, ports, [Bind(pki.mount, "/certs"), Bind(data, "/data")], tmp_path)
    try:
        avoid_window_edge(60, 5)
        with grpc_channel(rl, pki.mount) as channel:
            codes = [decide(channel, "eg", "client", "a") for _ in range(3)]
        assert codes == [OK, OK, OVER], rl.log()
        assert redis_server.client().dbsize() > 0  # counted in the Redis of REDIS_URL
    finally:
        stop_and_check_log(rl)


def test_xds_force_start_serves_with_no_control_plane_reachable(
    image: Image, redis_server: RedisServer, tmp_path: Path,
):
    """EG's own mode: CONFIG_TYPE=GRPC_XDS_SOTW with FORCE_START_WITHOUT_INITIAL_CONFIG, the
    controller's address closed. It serves at once: health, and every call OK (no limits)."""
    pki = eg_certificates(tmp_path)
    env, ports = eg_container_env(image, "GRPC_XDS_SOTW", redis_server)
    assert env["FORCE_START_WITHOUT_INITIAL_CONFIG"] == "true"
    env["CONFIG_GRPC_XDS_SERVER_URL"] = f"127.0.0.1:{free_port()}"  # nothing listens there
    rl = start(image, env, ports, [Bind(pki.mount, "/certs")], tmp_path)
    try:
        with grpc_channel(rl, pki.mount) as channel:
            answer = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=5)
            assert answer.status == health_pb2.HealthCheckResponse.SERVING
            assert decide(channel, "eg", "client", "a") == OK
    except grpc.RpcError as exc:
        raise AssertionError(f"{exc}\n{rl.log()}") from exc
    finally:
        stop_and_check_log(rl)


def test_the_charts_rls_container_runs_in_the_image(
    image: Image, redis_server: RedisServer, tmp_path: Path,
):
    """helm/rls with every part on (tests/deploy/kube.py: gRPC mTLS, two workers, Redis, the
    cache, envFrom), its rls container started in the image as the pod spec says: the
    podSecurityContext's user and group, readOnlyRootFilesystem, its volumes bound at their
    mount paths (the /tmp emptyDir writable), the image's ENV under the container's env, the
    image's ENTRYPOINT with the container's args. Its probes pass, a limit of 2 answers OK,
    OK, OVER_LIMIT, SIGTERM exits 0, nothing in the log says a write failed."""
    redis_server.client().flushall()
    run = runnable("everything", redis_server.url, tmp_path)
    spec = prepare_pod(template(helm_binary(), run.values, tmp_path), run.external,
                       tmp_path / "volumes")
    security = {**spec.pod.get("securityContext", {}), **spec.container["securityContext"]}
    uid = security["runAsUser"]
    assert security.get("runAsGroup", uid) == uid
    assert uid != 0 and str(uid) == image.user.split(":")[0]  # the image's own user
    env = {**image.env, "HOME": home_of(image, uid), **spec.env}
    binds = [Bind(directory, path, read_only=ro) for path, (directory, ro) in spec.mounts.items()]
    command = contained(image.root, spec.argv, env, user=uid, binds=binds,
                        read_only_root=security["readOnlyRootFilesystem"])
    log_path = tmp_path / "rls.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)

    def read_log() -> str:
        return log_path.read_text(errors="replace")

    try:
        for probe in ("readinessProbe", "livenessProbe"):
            wait_until(lambda p=probe: probe_passes(spec, spec.container[p]), timeout=60,
                       what=f"the rendered {probe}", log=read_log,
                       alive=lambda: proc.poll() is None)
        avoid_window_edge(60, 5)
        with channel(spec, run.credentials) as chan:
            codes = [decide(chan, "chart", "client", "a") for _ in range(3)]
        assert codes == [OK, OK, OVER], read_log()
        keys = redis_server.client().keys("*")
        assert keys and all(k.startswith(KEY_PREFIX.encode()) for k in keys), keys
    finally:
        assert stop_process(proc) == 0, read_log()
    assert not LOG_PROBLEMS.search(read_log()), read_log()


# ShouldRateLimit from inside the container, with the image's own Python and protos.
DECIDE_INSIDE = """
import grpc, sys
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
entry = ratelimit_pb2.RateLimitDescriptor.Entry(key=sys.argv[2], value=sys.argv[3])
request = rls_pb2.RateLimitRequest(
    domain=sys.argv[1], descriptors=[ratelimit_pb2.RateLimitDescriptor(entries=[entry])])
with grpc.insecure_channel("127.0.0.1:8081") as channel:
    stub = rls_pb2_grpc.RateLimitServiceStub(channel)
    print(rls_pb2.RateLimitResponse.Code.Name(stub.ShouldRateLimit(request, timeout=5)
                                              .overall_code))
"""


def test_docker_run_defaults_serve_and_pass_the_healthcheck(image: Image, tmp_path: Path):
    """`docker run --read-only rls`: ENTRYPOINT and CMD as the image's USER, on its read-only
    root, in a network of its own (its fixed ports 8081 and 8080 collide with nothing). The
    Dockerfile's HEALTHCHECK, run beside it as Docker runs it (same user, environment and
    network), exits 0; a call on the default descriptors answers; SIGTERM exits 0."""
    require_binary("ip", "iproute2")
    uid, gid = (int(part) for part in image.user.split(":"))
    assert uid == gid
    env = {**image.env, "HOME": home_of(image, uid)}
    command = contained(image.root, [*image.entrypoint, *image.cmd], env, user=uid,
                        read_only_root=True, own_network=True)
    log_path = tmp_path / "rls.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)

    def read_log() -> str:
        return log_path.read_text(errors="replace")

    def healthy() -> bool:
        check = subprocess.run(beside(proc.pid, image.healthcheck, env, uid),
                               capture_output=True, timeout=30)
        return check.returncode == 0

    try:
        wait_until(healthy, timeout=60, what="the Dockerfile's HEALTHCHECK", log=read_log,
                   alive=lambda: proc.poll() is None)
        call = subprocess.run(
            beside(proc.pid, ["python", "-c", DECIDE_INSIDE, "gateway", "remote_address",
                              "10.0.0.1"], env, uid),
            capture_output=True, text=True, timeout=60)
        assert call.stdout.strip() == "OK", call.stdout + call.stderr + read_log()
    finally:
        assert stop_process(proc) == 0, read_log()
    assert not LOG_PROBLEMS.search(read_log()), read_log()
