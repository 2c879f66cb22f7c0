"""OpenTelemetry SDK wiring: only the entry points call this (docs/DESIGN.md §5).

Library code uses the API alone (:mod:`._spans`, :mod:`._metrics`); this
module installs the global tracer and meter providers with the exporters the
deployment chose:

* traces (``CELLBLOCK_TRACES``): ``otlp`` (OTLP/gRPC; endpoint, headers and
  TLS from the standard ``OTEL_EXPORTER_OTLP_*`` variables), ``console``
  (JSON per span on stdout), ``jsonfile:<path>`` (JSON lines, read with
  ``cellblock-trace``) or ``none``;
* metrics (``CELLBLOCK_METRICS``): ``otlp``, ``console`` or ``none``.

The global providers can be set once per process.
"""

from __future__ import annotations

from dataclasses import dataclass

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import ConsoleMetricExporter, MetricExporter, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SimpleSpanProcessor
from opentelemetry.semconv.attributes.service_attributes import SERVICE_NAME

from cellblock.server.telemetry._jsonfile import JsonLinesSpanExporter


def span_processor(traces: str) -> SpanProcessor | None:
    """Builds the span processor for a ``CELLBLOCK_TRACES`` value.

    Raises:
        ValueError: The value is not ``otlp``, ``console``, ``jsonfile:<path>`` or ``none``.
    """
    if traces in ("", "none"):
        return None
    if traces == "otlp":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter  # noqa: PLC0415 - optional, heavy

        return BatchSpanProcessor(OTLPSpanExporter())
    if traces == "console":
        return SimpleSpanProcessor(ConsoleSpanExporter())
    if traces.startswith("jsonfile:") and len(traces) > len("jsonfile:"):
        # Simple (synchronous) so the file is complete when a leg's RPC ends.
        return SimpleSpanProcessor(JsonLinesSpanExporter(traces[len("jsonfile:") :]))
    raise ValueError(f"unknown traces exporter {traces!r}; use otlp, console, jsonfile:<path> or none")


def metric_exporter(metrics_setting: str) -> MetricExporter | None:
    """Builds the metric exporter for a ``CELLBLOCK_METRICS`` value.

    Raises:
        ValueError: The value is not ``otlp``, ``console`` or ``none``.
    """
    if metrics_setting in ("", "none"):
        return None
    if metrics_setting == "otlp":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter  # noqa: PLC0415 - optional, heavy

        return OTLPMetricExporter()
    if metrics_setting == "console":
        return ConsoleMetricExporter()
    raise ValueError(f"unknown metrics exporter {metrics_setting!r}; use otlp, console or none")


@dataclass
class Telemetry:
    """The installed providers; :meth:`shutdown` flushes and stops them.

    Attributes:
        tracer_provider: Set when traces are exported.
        meter_provider: Set when metrics are exported.
    """

    tracer_provider: TracerProvider | None = None
    meter_provider: MeterProvider | None = None

    def force_flush(self) -> None:
        """Exports every finished span now."""
        if self.tracer_provider is not None:
            self.tracer_provider.force_flush()

    def shutdown(self) -> None:
        """Flushes and stops the exporters."""
        if self.tracer_provider is not None:
            self.tracer_provider.shutdown()
        if self.meter_provider is not None:
            self.meter_provider.shutdown()


def configure_telemetry(traces: str = "none", metrics_setting: str = "none", service_name: str = "cellblock") -> Telemetry:
    """Installs the global tracer and meter providers.

    Args:
        traces: A ``CELLBLOCK_TRACES`` value.
        metrics_setting: A ``CELLBLOCK_METRICS`` value.
        service_name: The ``service.name`` resource attribute.

    Returns:
        The providers it installed (none for ``none``).

    Raises:
        ValueError: An exporter name is unknown.
    """
    resource = Resource.create({SERVICE_NAME: service_name})
    installed = Telemetry()
    processor = span_processor(traces)
    exporter = metric_exporter(metrics_setting)
    if processor is not None:
        installed.tracer_provider = TracerProvider(resource=resource)
        installed.tracer_provider.add_span_processor(processor)
        trace.set_tracer_provider(installed.tracer_provider)
    if exporter is not None:
        installed.meter_provider = MeterProvider(resource=resource, metric_readers=[PeriodicExportingMetricReader(exporter)])
        metrics.set_meter_provider(installed.meter_provider)
    return installed
