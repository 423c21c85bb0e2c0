"""The OTLP exporters import and encode in this install, whatever order pip wrote xds-protos'
old copy of the OpenTelemetry protos and opentelemetry-proto's own (rls/tracing/otlp_compat.py);
and what a fresh `pip install` of rls leaves for every other tool of its environment, before and
after the image's repair step (docs/observability.md).

Run in a fresh interpreter: the check must see the modules before anything imported them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

from rls.tracing import otlp_compat

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


def build_wheel(tmp_path: Path) -> Path:
    """rls's wheel, built from a copy of the checkout (setuptools writes build/ into the tree
    it builds)."""
    wheels, source = tmp_path / "wheels", tmp_path / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".*", "build", "*.egg-info", "__pycache__", "tests", "benchmarks"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "-w", str(wheels), str(source)],
                   check=True, capture_output=True, timeout=300)
    return next(wheels.glob("*.whl"))


def test_otlp_exporters_import_from_a_non_editable_install_of_rls(tmp_path: Path) -> None:
    """`pip install .` (the README's command) copies rls into site-packages: its copy of the
    overwritten OTLP protos must travel with it. rls is installed alone into a directory and
    run from elsewhere, so the checkout cannot stand in for it; the dependencies (xds-protos,
    opentelemetry-proto) are this environment's, whatever order pip wrote them in."""
    target = tmp_path / "site"
    wheel = build_wheel(tmp_path)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target",
                    str(target), str(wheel)], check=True, capture_output=True, timeout=300)
    check = SCRIPT + "import rls; print(rls.__file__)\n"
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True,
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(target)}, timeout=60)
    assert done.returncode == 0, done.stderr
    answer, origin = done.stdout.split()
    assert answer in ("stale", "clean")
    assert Path(origin).is_relative_to(target)


# What another tool of the environment sees: the fields of ResourceSpans, and whether every
# module of xds-protos that refers to OpenTelemetry's messages imports.
PROBE = """
import json, sys
from importlib.metadata import files
from importlib import import_module
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans

owned = [str(f) for f in files("xds-protos") if str(f).startswith("opentelemetry/proto/")]
referring = sorted(
    str(f)[:-3].replace("/", ".") for f in files("xds-protos")
    if str(f).startswith("envoy/") and str(f).endswith("_pb2.py")
    and b"opentelemetry/proto/" in f.locate().read_bytes())
for name in referring:
    import_module(name)
print(json.dumps({"fields": [f.name for f in ResourceSpans.DESCRIPTOR.fields],
                  "xds_protos_owns": len(owned), "envoy_modules": len(referring)}))
"""


def image_repair_step() -> str:
    """The Dockerfile's command that puts opentelemetry-proto's own files back."""
    text = re.sub(r"\\\n\s*", "", (ROOT / "Dockerfile").read_text())
    found = [step.strip() for line in text.splitlines() if line.startswith("RUN ")
             for step in line.removeprefix("RUN ").split("&&") if "--force-reinstall" in step]
    assert len(found) == 1, found
    return found[0]


def run_in(venv: Path, *args: str, timeout: float = 120) -> str:
    done = subprocess.run([str(venv / "bin" / "python"), *args], capture_output=True,
                          text=True, timeout=timeout, cwd=venv.parent)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.mark.slow
def test_a_fresh_install_needs_the_images_repair_step_for_current_opentelemetry_protos(
    tmp_path: Path,
) -> None:
    """`pip install rls` into a fresh venv (the wheel, its dependencies from the index): pip
    writes xds-protos' 2021 OpenTelemetry protos last, so another tool of the venv (an OTLP
    receiver, opentelemetry-instrument) gets `instrumentation_library_spans`, while rls's own
    tracing copes. The Dockerfile's repair step, run there as it is written, leaves
    opentelemetry-proto's messages (`scope_spans`) for everyone, xds-protos' own modules
    still importing and pip's dependency check clean; rls then uses the installed modules."""
    wheel = build_wheel(tmp_path)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    run_in(venv, "-m", "pip", "install", "-q", str(wheel), timeout=1200)

    before = json.loads(run_in(venv, "-c", PROBE))
    assert before["xds_protos_owns"], (
        "xds-protos no longer ships opentelemetry/proto: rls/tracing/vendor, otlp_compat and "
        "the Dockerfile's repair step can go (docs/observability.md)")
    assert "instrumentation_library_spans" in before["fields"], before
    assert run_in(venv, "-c", SCRIPT).split() == ["stale"]  # rls serves its copy to itself

    repair = image_repair_step().replace("/opt/rls/bin/", f"{venv}/bin/")
    done = subprocess.run(["sh", "-c", repair], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr

    after = json.loads(run_in(venv, "-c", PROBE))
    assert after["fields"] == ["resource", "scope_spans", "schema_url"], after
    assert after["envoy_modules"] == before["envoy_modules"] > 0
    assert run_in(venv, "-c", SCRIPT).split() == ["clean"]
    run_in(venv, "-m", "pip", "check")


def test_the_documented_repair_is_the_images() -> None:
    """docs/observability.md and rls's own error show the Dockerfile's step, for any
    environment."""
    command = image_repair_step().replace("/opt/rls/bin/", "").replace("--no-cache-dir ", "")
    assert command == otlp_compat.REPAIR
    assert command in (ROOT / "docs" / "observability.md").read_text()
