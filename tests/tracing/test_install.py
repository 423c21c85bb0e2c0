"""The OTLP exporters import and encode in this install, whatever order pip wrote xds-protos'
old copy of the OpenTelemetry protos and opentelemetry-proto's own (rls/tracing/otlp_compat.py).

Run in a fresh interpreter: the check must see the modules before anything imported them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import ROOT

SCRIPT = """
import sys
from rls.tracing import otlp_compat

stale = otlp_compat.installed_copy_is_stale()
assert otlp_compat.install() == stale
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as Grpc
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as Http
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

Grpc(endpoint="http://127.0.0.1:1"), Http(endpoint="http://127.0.0.1:1/v1/traces")
memory = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(memory))
with provider.get_tracer("rls").start_as_current_span("ShouldRateLimit") as span:
    span.set_attribute("rls.domain", "gateway")
wire = encode_spans(memory.get_finished_spans()).SerializeToString()
back = ExportTraceServiceRequest.FromString(wire)
scope = back.resource_spans[0].scope_spans[0]
assert scope.scope.name == "rls" and scope.spans[0].name == "ShouldRateLimit"
print("stale" if stale else "clean")
"""


def test_otlp_exporters_import_and_encode_a_span_in_this_install() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          cwd=ROOT, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() in ("stale", "clean")


def test_otlp_exporters_import_from_a_non_editable_install_of_rls(tmp_path: Path) -> None:
    """`pip install .` (the README's command) copies rls into site-packages: its copy of the
    overwritten OTLP protos must travel with it. rls is installed alone into a directory and
    run from elsewhere, so the checkout cannot stand in for it; the dependencies (xds-protos,
    opentelemetry-proto) are this environment's, whatever order pip wrote them in."""
    wheels, target, source = tmp_path / "wheels", tmp_path / "site", tmp_path / "source"
    # a copy: setuptools writes build/ into the tree it builds
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".*", "build", "*.egg-info", "__pycache__", "tests", "benchmarks"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "-w", str(wheels), str(source)],
                   check=True, capture_output=True, timeout=300)
    wheel = next(wheels.glob("*.whl"))
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target",
                    str(target), str(wheel)], check=True, capture_output=True, timeout=300)
    check = SCRIPT + "import rls; print(rls.__file__)\n"
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True,
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(target)}, timeout=60)
    assert done.returncode == 0, done.stderr
    answer, origin = done.stdout.split()
    assert answer in ("stale", "clean")
    assert Path(origin).is_relative_to(target)
