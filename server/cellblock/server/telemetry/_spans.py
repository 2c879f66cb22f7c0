"""Spans of runs, cells, snapshots and nested tool calls (API only; DESIGN.md §5).

The RPC server spans come from the contrib gRPC interceptor
(:func:`cellblock.server.telemetry.server_interceptors`); the W3C
``traceparent`` of the caller's metadata is their parent. Everything here is
started under them:

* ``cell.run`` (one per leg, the cell's whole life) with its child
  ``cell.acquire`` (bridge socket, container start, guest attach),
  ``snapshot.store`` (suspend request to stored snapshot) and
  ``snapshot.restore`` (snapshot sent to the restored guest's first message);
* ``bridge.tool_call`` (one per dispatched nested call, dispatch to answer),
  parented to the run's Exec span; see :func:`start_tool_call`.

Attributes never carry source text, tool inputs or outputs (SPEC §12 item 4).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.trace import Link, NonRecordingSpan, Span, SpanContext, Status, StatusCode, format_trace_id

from cellblock.server.telemetry import _attributes as attr
from cellblock.server.telemetry import _metrics

if TYPE_CHECKING:
    from cellblock.server.runs import PendingRequest, Run

_tracer = trace.get_tracer("cellblock.server")

#: The run whose Exec leg the current task serves (set by :func:`remember_exec_span`).
_exec_leg_of: ContextVar[str] = ContextVar("cellblock_exec_leg_of", default="")


def tracer() -> trace.Tracer:
    """The tracer of cellblock's library code (a no-op until the entry point installs an SDK)."""
    return _tracer


def current_trace_id() -> str:
    """The current span's W3C trace id as 32 lower-case hex digits, or ``""`` when none is sampled or set."""
    context = trace.get_current_span().get_span_context()
    return format_trace_id(context.trace_id) if context.is_valid else ""


def remember_exec_span(run: Run) -> None:
    """Stores the current (Exec RPC) span's context on ``run`` as the parent of its nested calls.

    Also marks the current task (and the tasks it starts) as the run's exec
    leg, where nested-call spans need no link.
    """
    run.exec_span_context = trace.get_current_span().get_span_context()
    _exec_leg_of.set(run.run_id)


def start_tool_call(run: Run, p: PendingRequest) -> None:
    """Starts the ``bridge.tool_call`` span of a nested call being dispatched.

    The span's **parent** is the run's Exec span (:attr:`Run.exec_span_context`),
    in every leg: DESIGN.md §5 wants nested calls to look like real tool calls
    under the code-mode call that made them, so a trace viewer shows all of a
    run's calls in one place whichever ``wait`` dispatched them. A parent (not
    only a link) is right because the exec is their causal origin: the program
    it submitted made every call; the wait merely resumed it. When the call is
    dispatched in a later leg, the span also carries a **link** to that leg's
    current span (its ``cell.run``, or the Wait RPC span before a cell), so the leg that sent it stays one click away
    even when the wait came in with another trace. The span stays open while
    the run is parked and ends when the runtime answers
    (:func:`end_tool_call`) or the run ends (:func:`end_open_tool_calls`).

    Args:
        run: The run; ``exec_span_context`` may be unset (tracing off).
        p: The request; ``nested_call_id`` and ``entry`` are set.
    """
    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        # No SDK installed (yet): the span would be the API's no-op span whatever it is given,
        # so its parent, links and attributes are not built for every nested call (issue 15).
        run.tool_spans[p.nested_call_id] = (trace.INVALID_SPAN, time.monotonic())
        return
    current = trace.get_current_span().get_span_context()
    parent: SpanContext | None = getattr(run, "exec_span_context", None)
    if parent is None or not parent.is_valid:
        parent = current
    in_exec_leg = _exec_leg_of.get() == run.run_id
    links = [Link(current)] if current.is_valid and not in_exec_leg and current.span_id != parent.span_id else []
    entry = p.call.entry if p.call is not None else None
    attributes: dict[str, Any] = {
        attr.RUN_ID: run.run_id,
        attr.SESSION_ID: run.session_id,
        attr.TOOL_CALL_ID: run.tool_call_id,
        attr.NESTED_CALL_ID: p.nested_call_id,
        attr.BRIDGE_ID: p.bridge_id,
        attr.TOOL_ID: str(getattr(entry, "id", "")),
        attr.TOOL_SOURCE: str(getattr(entry, "source", "")),
    }
    span = _tracer.start_span("bridge.tool_call", context=trace.set_span_in_context(NonRecordingSpan(parent)), attributes=attributes, links=links)
    run.tool_spans[p.nested_call_id] = (span, time.monotonic())


def end_tool_call(run: Run, nested_call_id: str, status: str, error: str = "") -> None:
    """Ends a nested call's span.

    Args:
        run: The run.
        nested_call_id: The call.
        status: ``ok``, ``error`` (the runtime failed it or its result was
            refused) or ``abandoned`` (the run ended first).
        error: The refusal's provenance or the runtime's error kind.
    """
    held = run.tool_spans.pop(nested_call_id, None)
    if held is None:
        return
    span, started = held
    if span is trace.INVALID_SPAN:
        return  # started without an SDK (start_tool_call): nothing records it
    span.set_attribute(attr.TOOL_CALL_STATUS, status)
    span.set_attribute(attr.TOOL_CALL_DURATION_MS, int((time.monotonic() - started) * 1000))
    if status != "ok":
        span.set_attribute(attr.ERROR_TYPE, error or status)
        span.set_status(Status(StatusCode.ERROR, status))
    span.end()


def end_open_tool_calls(run: Run) -> None:
    """Ends the spans of calls still unanswered when ``run`` ends (``abandoned``)."""
    for nested_call_id in list(run.tool_spans):
        end_tool_call(run, nested_call_id, "abandoned")


def annotate_rpc(kind: str, report: Any) -> None:
    """Puts a leg's outcome on the current (RPC server) span and counts it.

    Args:
        kind: ``exec`` or ``wait``.
        report: The :class:`~cellblock.server.runs.LegReport`.
    """
    _metrics.record_leg(kind, report.status, report.code)
    span = trace.get_current_span()
    run = report.run
    attributes: dict[str, Any] = {attr.RPC_KIND: kind, attr.RUN_STATUS: report.status}
    if report.code:
        attributes[attr.ERROR_TYPE] = report.code
    telemetry = report.result.get("telemetry") if isinstance(report.result, dict) else None
    if isinstance(telemetry, dict) and "catalogSize" in telemetry:
        attributes[attr.CATALOG_SIZE] = int(telemetry["catalogSize"])
    if run is not None:
        attributes.update({attr.RUN_ID: run.run_id, attr.SESSION_ID: run.session_id, attr.AGENT_RUN_ID: run.agent_run_id, attr.TOOL_CALL_ID: run.tool_call_id, attr.LEG: run.legs})
        if run.snapshot_bytes:
            attributes[attr.SNAPSHOT_BYTES] = run.snapshot_bytes
    if report.cell_id:
        attributes[attr.CELL_ID] = report.cell_id
    span.set_attributes(attributes)


class LegTrace:
    """The spans of one leg's cell (``cell.run`` and its children).

    Args:
        run: The run.
        executor: The executor starting the cell (``name``, ``image``).
    """

    def __init__(self, run: Run, executor: Any) -> None:
        self._run = run
        self._executor = str(getattr(executor, "name", ""))
        self._image = str(getattr(executor, "image", ""))
        self._span: Span = trace.INVALID_SPAN
        self._acquire: Span | None = None
        self._acquire_started = 0.0
        self._suspend_ns = 0
        self._restore: Span | None = None
        self._restore_started = 0.0

    @contextmanager
    def running(self) -> Iterator[None]:
        """Makes a ``cell.run`` span current for the leg; exceptions are recorded."""
        run = self._run
        attributes: dict[str, Any] = {attr.RUN_ID: run.run_id, attr.SESSION_ID: run.session_id, attr.AGENT_RUN_ID: run.agent_run_id, attr.EXECUTOR: self._executor, attr.LEG: run.legs + 1}
        if self._image:
            attributes[attr.CONTAINER_IMAGE_NAME] = self._image
        with _tracer.start_as_current_span("cell.run", attributes=attributes) as span:
            self._span = span
            try:
                yield
            finally:
                for open_span in (self._acquire, self._restore):
                    if open_span is not None and open_span.is_recording():
                        open_span.set_status(Status(StatusCode.ERROR, "leg ended first"))
                        open_span.end()

    def acquiring(self, cell_id: str) -> None:
        """Starts ``cell.acquire`` for the cell about to be asked for."""
        self._span.set_attribute(attr.CELL_ID, cell_id)
        attributes: dict[str, Any] = {attr.CELL_ID: cell_id, attr.EXECUTOR: self._executor}
        if self._image:
            attributes[attr.CONTAINER_IMAGE_NAME] = self._image
        self._acquire = _tracer.start_span("cell.acquire", attributes=attributes)
        self._acquire_started = time.monotonic()

    def started(self, runtime_id: str) -> None:
        """Records the runtime id (container id or pid) of the started cell."""
        for span in (self._span, self._acquire):
            if span is not None:
                span.set_attribute(attr.CONTAINER_ID, runtime_id)

    def attached(self) -> None:
        """Ends ``cell.acquire`` once the guest attached; records the start latency."""
        if self._acquire is None:
            return
        _metrics.record_cell_start(time.monotonic() - self._acquire_started, self._executor)
        self._acquire.end()
        self._acquire = None

    def finish(self, status: str, code: str) -> None:
        """Puts the leg's outcome on ``cell.run``."""
        self._span.set_attribute(attr.RUN_STATUS, status)
        if code:
            self._span.set_attribute(attr.ERROR_TYPE, code)
            if status == "failed" and code != "aborted":
                self._span.set_status(Status(StatusCode.ERROR, code))

    def suspend_requested(self) -> None:
        """Notes when the host asked the guest to serialise its VM."""
        self._suspend_ns = time.time_ns()

    def snapshot_stored(self, size_bytes: int, raw_bytes: int, error: str = "") -> None:
        """Records ``snapshot.store``: from the suspend request to the received snapshot.

        Args:
            size_bytes: Compressed snapshot size in bytes.
            raw_bytes: Uncompressed VM image size in bytes.
            error: The error code when the snapshot was refused (too large).
        """
        attributes: dict[str, Any] = {attr.RUN_ID: self._run.run_id, attr.SNAPSHOT_BYTES: size_bytes, attr.SNAPSHOT_RAW_BYTES: raw_bytes}
        span = _tracer.start_span("snapshot.store", attributes=attributes, start_time=self._suspend_ns or None)
        if error:
            span.set_attribute(attr.ERROR_TYPE, error)
            span.set_status(Status(StatusCode.ERROR, error))
        else:
            _metrics.record_snapshot(size_bytes)
        self._span.set_attribute(attr.SNAPSHOT_BYTES, size_bytes)
        span.end()

    def restoring(self, size_bytes: int) -> None:
        """Starts ``snapshot.restore`` as the snapshot is sent to the cell."""
        self._restore = _tracer.start_span("snapshot.restore", attributes={attr.RUN_ID: self._run.run_id, attr.SNAPSHOT_BYTES: size_bytes})
        self._restore_started = time.monotonic()

    def guest_spoke(self) -> None:
        """Ends ``snapshot.restore`` at the restored guest's first message (the resume time)."""
        if self._restore is None:
            return
        resume_ms = int((time.monotonic() - self._restore_started) * 1000)
        self._restore.set_attribute(attr.RESUME_MS, resume_ms)
        self._span.set_attribute(attr.RESUME_MS, resume_ms)
        self._restore.end()
        self._restore = None
