"""Let the OTLP exporters import even when xds-protos overwrote opentelemetry-proto's files.

See `rls/tracing/vendor/otlp_proto/__init__.py` for why the files are overwritten. `install()` runs
before any exporter is imported: when the installed `common_pb2` is the old copy (checked by
reading the file, never by importing it: an imported old copy would register its messages
in protobuf's descriptor pool and block the right ones), a finder placed first on
`sys.meta_path` serves the eight overwritten modules from rls's copy. Every other module of
`opentelemetry.proto` (packages, gRPC stubs, profiles) still comes from the installed package,
whose other files xds-protos leaves alone. With a clean opentelemetry-proto nothing changes.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

_HERE = Path(__file__).parent / "vendor" / "otlp_proto"
_P = "opentelemetry.proto."
# module name -> rls's copy (the eight files xds-protos ships under the same names)
MODULES = {
    _P + "common.v1.common_pb2": "common_pb2.py",
    _P + "resource.v1.resource_pb2": "resource_pb2.py",
    _P + "trace.v1.trace_pb2": "trace_pb2.py",
    _P + "logs.v1.logs_pb2": "logs_pb2.py",
    _P + "metrics.v1.metrics_pb2": "metrics_pb2.py",
    _P + "collector.trace.v1.trace_service_pb2": "trace_service_pb2.py",
    _P + "collector.logs.v1.logs_service_pb2": "logs_service_pb2.py",
    _P + "collector.metrics.v1.metrics_service_pb2": "metrics_service_pb2.py",
}
_CANARY = _P + "common.v1.common_pb2"
# Puts opentelemetry-proto's own files back over xds-protos' copy, at the installed version
# (docs/observability.md, "OpenTelemetry protos in rls's environment"; the Dockerfile runs it).
REPAIR = ('pip install --no-deps --force-reinstall "opentelemetry-proto==$(pip show '
          "opentelemetry-proto | sed -n 's/^Version: //p')\"")


class OtlpProtoError(RuntimeError):
    """The OTLP protos cannot be made importable (said how to repair the install)."""


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        name = MODULES.get(fullname)
        if name is None:
            return None
        return importlib.util.spec_from_file_location(fullname, _HERE / name)


_FINDER = _Finder()


def installed_copy_is_stale() -> bool:
    """Whether the installed `opentelemetry.proto` messages are xds-protos' 2021 copy."""
    spec = importlib.util.find_spec(_CANARY)
    if spec is None or spec.origin is None:
        raise OtlpProtoError(
            "opentelemetry-proto is not installed: pip install 'opentelemetry-proto>=1.30'"
        )
    return b"InstrumentationScope" not in Path(spec.origin).read_bytes()


def install() -> bool:
    """Serve rls's copy of the overwritten modules if needed; whether it is in use."""
    if _FINDER in sys.meta_path:
        return True
    if not installed_copy_is_stale():
        return False
    loaded = [name for name in MODULES if name in sys.modules]
    if loaded:
        raise OtlpProtoError(
            f"{loaded[0]} was imported from xds-protos' old copy before tracing started; "
            f"repair the install: {REPAIR}"
        )
    sys.meta_path.insert(0, _FINDER)
    return True
