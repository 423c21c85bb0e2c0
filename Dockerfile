# syntax=docker/dockerfile:1
# rls: Envoy external rate-limit service (gRPC 8081, admin HTTP 8080).
#
#   docker build -t rls .
#   docker run --rm -p 8081:8081 -p 8080:8080 rls                 # config/ examples, memory
#   docker run --rm -p 8081:8081 -p 8080:8080 \
#       -v "$PWD/my-descriptors:/etc/rls/config:ro" \
#       -e RLS_REDIS_URL=redis://redis:6379/0 rls                   # your YAML, counters in Redis
#
# Every flag of `rls serve` is also an environment variable RLS_<NAME> (docs/configuration.md).
# Tracing is in the image (OpenTelemetry is a dependency): TRACING_ENABLED=true and
# OTEL_EXPORTER_OTLP_ENDPOINT, as Envoy Gateway sets them (docs/observability.md#tracing).
# Checked by tests/deploy/test_dockerfile.py (no Docker needed): entrypoint, ports, healthcheck
# path, non-root user, Python version, build context; and by tests/deploy/test_image.py, which
# replays the runtime stage on a Debian root and starts it as Envoy Gateway does (docs/deploy.md).

# --- build: the wheel (setuptools from pyproject's [build-system], in pip's isolated env) ----
FROM python:3.11-slim-bookworm AS build
WORKDIR /src
COPY pyproject.toml README.md ./
# rls/lua is a symlink to ../lua: the Redis scripts ship inside the wheel through it.
COPY lua/ lua/
COPY rls/ rls/
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

# --- runtime: the wheel and its dependencies in a venv, nothing else --------------------------
FROM python:3.11-slim-bookworm AS runtime
# TMPDIR: the only writes rls makes are --workers > 1's shared directory (status, multiprocess
# metrics). /dev/shm is the tmpfs every container runtime mounts writable, even on a read-only
# root with no /tmp volume, which is how Envoy Gateway runs this image.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    TMPDIR=/dev/shm \
    PATH=/opt/rls/bin:$PATH
COPY --from=build /wheels /tmp/wheels
# xds-protos (Envoy's API) writes a 2021 copy of OpenTelemetry's protos over opentelemetry-proto's
# files, and pip installs it last: the second install puts opentelemetry-proto's own back (same
# version), so that any OpenTelemetry tool run in this venv gets current messages
# (docs/observability.md#opentelemetry-protos-in-rlss-environment; rls copes either way).
RUN python -m venv /opt/rls \
    && /opt/rls/bin/pip install --no-cache-dir /tmp/wheels/*.whl \
    && /opt/rls/bin/pip install --no-cache-dir --no-deps --force-reinstall \
       "opentelemetry-proto==$(/opt/rls/bin/pip show opentelemetry-proto | sed -n 's/^Version: //p')" \
    && rm -rf /tmp/wheels \
    && groupadd --system --gid 10001 rls \
    && useradd --system --uid 10001 --gid rls --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin rls \
    && ln -s /opt/rls/bin/ratelimit /bin/ratelimit
# /bin/ratelimit: the reference's path and contract (no arguments, its environment variables;
# Envoy Gateway starts the image that way, as uid 65534 on a read-only root filesystem: rls
# writes nothing, every installed file is world-readable). docs/envoy-gateway.md.
# Default descriptors: the examples and field scenarios of config/ (cache rules are not
# descriptors; mount them and pass --cache-config). Mount your own over /etc/rls/config.
COPY config/example.yaml config/scenario-*.yaml /etc/rls/config/
USER 10001:10001
# 8081: gRPC RateLimitService + grpc.health.v1; 8080: admin HTTP (/healthcheck, /metrics, ...)
EXPOSE 8081 8080
# No curl in slim images: Python's urllib. Non-200 or no answer -> exit 1 -> unhealthy.
HEALTHCHECK --interval=10s --timeout=3s --start-period=15s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8080/healthcheck', timeout=2).status == 200 else 1)"]
ENTRYPOINT ["rls"]
# The admin API listens on the container's loopback only (HEALTHCHECK runs inside, so it
# works). To reach it from outside (probes, Prometheus), give it a token as well:
#   docker run -e RLS_ADMIN_TOKEN=... -e RLS_HTTP_ADDR=0.0.0.0:8080 -p 8080:8080 ...
# rls refuses to start with the admin listener off loopback and no token (docs/admin.md).
CMD ["serve", "--config", "/etc/rls/config"]
