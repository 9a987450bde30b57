"""Rollout spans also go out over OTLP when the standard OpenTelemetry settings ask for it."""

from __future__ import annotations

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from rollq.worker.tracer import _export_otlp_if_configured


def _exporters(provider: TracerProvider) -> list[object]:
    processors = provider._active_span_processor._span_processors  # the SDK keeps no public list
    return [p.span_exporter for p in processors if isinstance(p, BatchSpanProcessor)]


def test_otlp_endpoint_adds_an_otlp_exporter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
    provider = TracerProvider()
    _export_otlp_if_configured(provider)
    exporters = _exporters(provider)
    assert len(exporters) == 1 and isinstance(exporters[0], OTLPSpanExporter)
    provider.shutdown()


def test_without_otlp_settings_nothing_is_exported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
    provider = TracerProvider()
    _export_otlp_if_configured(provider)
    assert _exporters(provider) == []
