"""rls's copy of the OTLP modules is used only in place of xds-protos' old copy, and never
after the old copy was imported (its messages would already sit in protobuf's pool)."""

from __future__ import annotations

import importlib.machinery
import importlib.util
from pathlib import Path

import pytest

from rls.tracing import otlp_compat


def _installed_as(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, text: bytes) -> None:
    origin = tmp_path / "common_pb2.py"
    origin.write_bytes(text)
    spec = importlib.machinery.ModuleSpec("common_pb2", None, origin=str(origin))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: spec)


def test_a_current_opentelemetry_proto_is_left_alone(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _installed_as(monkeypatch, tmp_path, b"...InstrumentationScope...")
    monkeypatch.setattr(otlp_compat.sys, "meta_path", [])
    assert otlp_compat.install() is False
    assert otlp_compat.sys.meta_path == []


def test_xds_protos_old_copy_is_replaced_by_rls_copy(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _installed_as(monkeypatch, tmp_path, b"...InstrumentationLibrary...")
    monkeypatch.setattr(otlp_compat.sys, "meta_path", [])
    monkeypatch.setattr(otlp_compat.sys, "modules", {})
    assert otlp_compat.install() is True
    finder = otlp_compat.sys.meta_path[0]
    spec = finder.find_spec("opentelemetry.proto.trace.v1.trace_pb2", None)
    assert spec is not None and spec.origin is not None
    assert Path(spec.origin).parent.name == "otlp_proto"
    assert finder.find_spec("opentelemetry.proto.trace.v1.trace_pb2_grpc", None) is None


def test_an_old_copy_already_imported_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _installed_as(monkeypatch, tmp_path, b"...InstrumentationLibrary...")
    monkeypatch.setattr(otlp_compat.sys, "meta_path", [])
    monkeypatch.setattr(otlp_compat.sys, "modules",
                        {"opentelemetry.proto.common.v1.common_pb2": object()})
    with pytest.raises(otlp_compat.OtlpProtoError) as caught:
        otlp_compat.install()
    assert str(caught.value).endswith(f"repair the install: {otlp_compat.REPAIR}")
