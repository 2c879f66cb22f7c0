"""A span exporter writing one JSON object per finished span (JSON lines).

For ``CELLBLOCK_TRACES=jsonfile:<path>``: a person can read what a program
did without a tracing backend (``cellblock-trace``, :mod:`.trace`). Built on
the SDK's :class:`~opentelemetry.sdk.trace.export.SpanExporter` interface, so
only the entry point imports it.

Record shape (keys always present)::

    {"name": str, "trace_id": 32 hex, "span_id": 16 hex,
     "parent_span_id": 16 hex or null, "kind": "SERVER"|"INTERNAL"|...,
     "start_ns": int, "end_ns": int (Unix epoch nanoseconds),
     "status": "UNSET"|"OK"|"ERROR", "status_description": str or null,
     "attributes": {str: value}, "events": [{"name", "time_ns", "attributes"}],
     "links": [{"trace_id", "span_id", "attributes"}]}
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import format_span_id, format_trace_id


def span_record(span: ReadableSpan) -> dict[str, Any]:
    """Converts a finished span into the JSON-lines record (module docstring)."""
    context = span.get_span_context()
    assert context is not None
    return {
        "name": span.name,
        "trace_id": format_trace_id(context.trace_id),
        "span_id": format_span_id(context.span_id),
        "parent_span_id": format_span_id(span.parent.span_id) if span.parent is not None else None,
        "kind": span.kind.name,
        "start_ns": span.start_time,
        "end_ns": span.end_time,
        "status": span.status.status_code.name,
        "status_description": span.status.description,
        "attributes": dict(span.attributes or {}),
        "events": [{"name": e.name, "time_ns": e.timestamp, "attributes": dict(e.attributes or {})} for e in span.events],
        "links": [{"trace_id": format_trace_id(link.context.trace_id), "span_id": format_span_id(link.context.span_id), "attributes": dict(link.attributes or {})} for link in span.links],
    }


class JsonLinesSpanExporter(SpanExporter):
    """Appends each finished span as one JSON line to a file.

    Args:
        path: The file; created with its parent directories, appended to.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._file = self.path.open("a", encoding="utf-8")

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = "".join(json.dumps(span_record(s), separators=(",", ":"), ensure_ascii=False, default=str) + "\n" for s in spans)
        with self._lock:
            if self._file.closed:
                return SpanExportResult.FAILURE
            self._file.write(lines)
            self._file.flush()
        return SpanExportResult.SUCCESS

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        with self._lock:
            if not self._file.closed:
                self._file.flush()
        return True

    def shutdown(self) -> None:
        with self._lock:
            self._file.close()
