"""The OpenTelemetry SDK: whether one is configured, and setting one up from ``OTEL_*``."""

from __future__ import annotations

import os

from opentelemetry import metrics, trace


def sdk_configured(provider: object) -> bool:
    """Whether ``provider`` is an SDK's, not the API's proxy or no-op default."""
    name = type(provider).__name__
    return not (name.startswith(("Proxy", "_Proxy", "NoOp", "_NoOp")))


def configure_otel(service_name: str = "aqw-worker") -> bool:
    """Configure the OpenTelemetry SDK from the standard ``OTEL_*`` environment variables
    (OTLP/HTTP exporter) when the ``otel`` extra is installed and an
    ``OTEL_EXPORTER_OTLP[_TRACES|_METRICS]_ENDPOINT`` is set; returns False otherwise.
    Used by ``aqw worker`` and ``aqw monitor``; libraries embedding aqw configure their own."""
    try:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        return False
    if os.environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return False
    endpoints = ("", "_TRACES", "_METRICS")
    if not any(os.environ.get(f"OTEL_EXPORTER_OTLP{e}_ENDPOINT") for e in endpoints):
        return False  # nowhere to export to: stay off rather than retry a default port
    resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", service_name)})
    tracer_provider = TracerProvider(resource=resource)
    tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(tracer_provider)
    reader = PeriodicExportingMetricReader(OTLPMetricExporter())
    metrics.set_meter_provider(MeterProvider(resource=resource, metric_readers=[reader]))
    return True


def shutdown_otel() -> None:
    """Flush and shut down SDK providers configured by ``configure_otel``."""
    for provider in (trace.get_tracer_provider(), metrics.get_meter_provider()):
        shutdown = getattr(provider, "shutdown", None)
        if callable(shutdown):
            shutdown()
