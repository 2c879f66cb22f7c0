"""CodeModeService: the tool surface and the Exec/Wait streams (SPEC §3.3–3.4)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import structlog
from google.protobuf.message import Message
from structlog.typing import FilteringBoundLogger

from cellblock.server import messages as msg
from cellblock.server.api._catalog_wire import serialized
from cellblock.server.api._catalogs import RunCatalog
from cellblock.server.api._scope import require_scope, require_short_ids
from cellblock.server.api._state import ServiceState
from cellblock.server.api._stream_ports import StreamPorts
from cellblock.server.catalog import CatalogEntry
from cellblock.server.limits import INLINE_JSON_CHARS, LARGE_JSON_BUDGET_MS, MAX_SCOPE_ID_CHARS
from cellblock.server.runs import (
    CatalogPort,
    ErrorCode,
    LegReport,
    PreparedResult,
    Run,
    Runner,
    RunStatus,
    Telemetry,
    ToolErrorKind,
    ToolOutcome,
    join_bytes,
    portable,
    result_in_worker,
    result_json,
)
from cellblock.server.telemetry import annotate_rpc, current_trace_id
from cellblock.server.workers import CpuPool, WorkBudgetExceeded, WorkerFailed
from cellblock.v1 import code_mode_service_pb2 as pb

log = structlog.get_logger("cellblock.rpc")

_STATUS = {RunStatus.COMPLETED: pb.RUN_STATUS_COMPLETED, RunStatus.WAITING: pb.RUN_STATUS_WAITING, RunStatus.FAILED: pb.RUN_STATUS_FAILED}
_CODES = {
    None: pb.ERROR_CODE_UNSPECIFIED,
    ErrorCode.INVALID_INPUT: pb.ERROR_CODE_INVALID_INPUT,
    ErrorCode.RUNTIME_UNAVAILABLE: pb.ERROR_CODE_RUNTIME_UNAVAILABLE,
    ErrorCode.ABORTED: pb.ERROR_CODE_ABORTED,
    ErrorCode.TIMEOUT: pb.ERROR_CODE_TIMEOUT,
    ErrorCode.OUTPUT_LIMIT_EXCEEDED: pb.ERROR_CODE_OUTPUT_LIMIT_EXCEEDED,
    ErrorCode.SNAPSHOT_LIMIT_EXCEEDED: pb.ERROR_CODE_SNAPSHOT_LIMIT_EXCEEDED,
    ErrorCode.INTERNAL_ERROR: pb.ERROR_CODE_INTERNAL_ERROR,
}
_ERROR_KINDS = {
    pb.TOOL_ERROR_KIND_UNSPECIFIED: ToolErrorKind.FAILED,
    pb.TOOL_ERROR_KIND_INVALID_INPUT: ToolErrorKind.INVALID_INPUT,
    pb.TOOL_ERROR_KIND_BLOCKED: ToolErrorKind.BLOCKED,
    pb.TOOL_ERROR_KIND_FAILED: ToolErrorKind.FAILED,
    pb.TOOL_ERROR_KIND_CANCELLED: ToolErrorKind.CANCELLED,
}


def _overrides(limits: pb.LimitOverrides) -> dict[str, int]:
    names = {
        "timeout_ms": "timeoutMs",
        "memory_limit_bytes": "memoryLimitBytes",
        "max_output_bytes": "maxOutputBytes",
        "max_snapshot_bytes": "maxSnapshotBytes",
        "max_pending_tool_calls": "maxPendingToolCalls",
        "snapshot_ttl_seconds": "snapshotTtlSeconds",
    }
    return {camel: getattr(limits, field) for field, camel in names.items() if limits.HasField(field)}  # type: ignore[arg-type]


async def _result_message(report: LegReport) -> pb.Result:
    run = report.run
    metadata = pb.RunMetadata(cell_id=report.cell_id)
    if run is not None:
        metadata.bridge_calls.CopyFrom(pb.BridgeCallCounts(**run.counts))
        metadata.leg_count = run.legs
        metadata.snapshot_bytes = run.snapshot_bytes
    return pb.Result(
        result_json=await result_json(report.result),
        status=_STATUS[report.status],
        code=_CODES[report.code],
        run_id=report.run_id,
        metadata=metadata,
        trace_id=current_trace_id(),
    )


async def _read_start(kind: str, iterator: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> tuple[Any, tuple[str, str]]:
    """Reads and checks a leg stream's start message; aborts the RPC with INVALID_ARGUMENT.

    Returns:
        The ``ExecStart`` or ``WaitStart`` and the scope.
    """
    try:
        first = await iterator.__anext__()
    except StopAsyncIteration:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"the {kind} stream closed before its start message")
    if first.WhichOneof("message") != "start":
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"the first message of a {kind.capitalize()} stream must be start")
    start = first.start
    scope = await require_scope(start.scope, context)
    if not start.tool_call_id.strip():
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "start.tool_call_id must be a non-empty string")
    await require_short_ids(context, **{"start.tool_call_id": start.tool_call_id, "start.turn_id": getattr(start, "turn_id", "")})
    return start, scope


async def _long_result(cpu: CpuPool, scope: tuple[str, str], nested_call_id: str, ok_json: str, entry: CatalogEntry | None) -> ToolOutcome:
    """A long tool result read, and checked against its output contract when the entry is known, in a worker (SPEC §3.1 item 6).

    Reading megabytes of dense JSON and writing them again took the loop 240 ms for 7 MB. A
    worker over its budget or gone fails the call with [B26].
    """
    checked = portable(entry) if entry is not None and entry.output_validator is not None else None
    try:
        prepared = await cpu.run(result_in_worker, ok_json, checked, budget_s=LARGE_JSON_BUDGET_MS / 1000.0, size=len(ok_json), tenant=scope)
    except (WorkBudgetExceeded, WorkerFailed):
        prepared = PreparedResult(len(ok_json.encode("utf-8", "surrogatepass")), False, overran=True)
    return ToolOutcome(nested_call_id, ok_json=ok_json, prepared=prepared)


async def _read_runtime(iterator: AsyncIterator[Any], ports: StreamPorts, cpu: CpuPool, scope: tuple[str, str], stream: tuple[str, grpc.aio.ServicerContext]) -> None:
    """Puts the runtime's tool results and cancel on the leg's queue until the stream ends.

    A second start message (``stream``: the leg's kind and RPC context) ends the RPC with
    ``INVALID_ARGUMENT`` [A04] and the leg like an undecodable message ([A01], SPEC §3.1 item 4).

    A long result is read in a worker first (:func:`_long_result`) by a second task, and the
    results after it wait for it, so results keep their order; a ``Cancel`` never waits for
    it (SPEC §3.6 item 1): the read is dropped with the leg. A short result with nothing
    before it goes to the leg at once.
    """
    results: asyncio.Queue[ToolOutcome | tuple[str, str, CatalogEntry | None] | None] = asyncio.Queue()
    reading = [False]  # the delivery task is reading a long result in a worker
    delivery = asyncio.ensure_future(_deliver_results(results, ports, cpu, scope, reading))

    def short(outcome: ToolOutcome) -> None:
        # Straight to the leg when nothing before it waits (no task switch per result), else behind it.
        if results.empty() and not reading[0]:
            ports.tool_result(outcome)
        else:
            results.put_nowait(outcome)
    try:
        try:
            async for message in iterator:
                which = message.WhichOneof("message")
                if which == "tool_result":
                    tr = message.tool_result
                    if len(tr.nested_call_id) > MAX_SCOPE_ID_CHARS:
                        log.warning("tool_result.id_too_long", length=len(tr.nested_call_id))
                        continue  # never one of ours (SPEC §3.5 item 6)
                    entry = ports.sent_calls.pop(tr.nested_call_id, None)
                    # Each read of a string field decodes it again (60 MB: 20-60 ms on the loop): once.
                    text = tr.ok_json if tr.WhichOneof("outcome") == "ok_json" else ""
                    if len(text) > INLINE_JSON_CHARS:
                        results.put_nowait((tr.nested_call_id, text, entry))
                    else:
                        short(_short_outcome(tr))
                elif which == "cancel":
                    ports.cancel()
                elif which == "start":
                    await stream[1].abort(grpc.StatusCode.INVALID_ARGUMENT, msg.a04(stream[0]))
        except grpc.aio.AioRpcError:
            pass
        except grpc.aio.AbortError:
            # An undecodable message ended the stream ([A01], api/_failures.py): nobody can answer the
            # leg's calls or read its Result, so it ends now like a caller gone, instead of running
            # on to its deadline and parking a run (holding a suspended-run slot) no caller knows.
            ports.cancel()
        results.put_nowait(None)
        await delivery  # what the stream sent before it ended still reaches the leg
    except asyncio.CancelledError:
        pass
    finally:
        delivery.cancel()


def _short_outcome(tr: pb.ToolResult) -> ToolOutcome:
    """A tool result read on the loop: a short ``ok_json``, ``oversized_bytes`` or an error."""
    outcome = tr.WhichOneof("outcome")
    if outcome == "ok_json":
        return ToolOutcome(tr.nested_call_id, ok_json=tr.ok_json)
    if outcome == "oversized_bytes":
        return ToolOutcome(tr.nested_call_id, oversized_bytes=max(1, tr.oversized_bytes))
    return ToolOutcome(tr.nested_call_id, error_kind=_ERROR_KINDS.get(tr.error.kind, ToolErrorKind.FAILED), error_message=tr.error.message)


async def _deliver_results(
    results: asyncio.Queue[ToolOutcome | tuple[str, str, CatalogEntry | None] | None], ports: StreamPorts, cpu: CpuPool, scope: tuple[str, str], reading: list[bool]
) -> None:
    """Hands the leg the queued results in arrival order, a long one once a worker read it (``reading[0]`` meanwhile); ``None`` ends."""
    while (item := await results.get()) is not None:
        if isinstance(item, ToolOutcome):
            ports.tool_result(item)
            continue
        reading[0] = True
        try:
            outcome = await _long_result(cpu, scope, *item)
        finally:
            reading[0] = False
        ports.tool_result(outcome)


def _log_completed(bound: FilteringBoundLogger, report: LegReport, started: float) -> None:
    """Writes the RPC's canonical line; failures other than aborts at warning level."""
    level = "warning" if report.status is RunStatus.FAILED and report.code is not ErrorCode.ABORTED else "info"
    run_ids = {"run_id": report.run.run_id, "tool_call_id": report.run.tool_call_id} if report.run else {"run_id": ""}
    getattr(bound, level)("rpc.completed", status=report.status, code=report.code or "", cell_id=report.cell_id or None, **run_ids, duration_ms=int((time.monotonic() - started) * 1000))


_SERVICE = pb.DESCRIPTOR.services_by_name["CodeModeService"].full_name

#: Characters of tool definitions serialized between two loop turns while a tool surface is built.
_SURFACE_SLICE_CHARS = 1 << 20


class CodeModeService:
    """The model-facing service (registered by :meth:`add_to_server`, not the generated base: it may answer with bytes)."""

    def __init__(self, state: ServiceState, runner: Runner) -> None:
        self._state = state
        self._runner = runner

    def add_to_server(self, server: grpc.aio.Server) -> None:
        """Registers the service like the generated ``add_CodeModeServiceServicer_to_server``.

        ``GetToolSurface`` may answer with its response already serialized (``bytes``).
        """
        handlers = {
            "GetToolSurface": grpc.unary_unary_rpc_method_handler(self.GetToolSurface, request_deserializer=pb.GetToolSurfaceRequest.FromString, response_serializer=serialized),
            "Exec": grpc.stream_stream_rpc_method_handler(self.Exec, request_deserializer=pb.ExecRequest.FromString, response_serializer=pb.ExecResponse.SerializeToString),
            "Wait": grpc.stream_stream_rpc_method_handler(self.Wait, request_deserializer=pb.WaitRequest.FromString, response_serializer=pb.WaitResponse.SerializeToString),
        }
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(_SERVICE, handlers),))
        server.add_registered_method_handlers(_SERVICE, handlers)

    async def GetToolSurface(self, request: pb.GetToolSurfaceRequest, context: grpc.aio.ServicerContext) -> pb.GetToolSurfaceResponse | bytes:  # noqa: N802
        """The tool surface (SPEC §3.3), serialized once per catalog version and model engagement.

        Tens of MB for a scope with large schemas: the response is built a tool at a time
        between loop turns and kept with the catalog version (SPEC §3.1 item 6).
        """
        scope = await require_scope(request.scope, context)
        catalog = self._state.catalogs.get(scope)
        if catalog is None:
            return pb.GetToolSurfaceResponse(code_mode_engaged=False)
        view = catalog.catalog.view
        engaged, tools = catalog.tool_surface(self._state.config, request.model_id or None)
        kept: bytes | None = catalog.surface_response(view, engaged)
        if kept is not None:
            return kept
        parts, size = [pb.GetToolSurfaceResponse(code_mode_engaged=engaged).SerializeToString()], 0
        for name, description, parameters in tools:
            # A repeated field's entries concatenate: one single-tool response per tool is the same wire form.
            parts.append(pb.GetToolSurfaceResponse(tools=[pb.ToolDefinition(name=name, description=description, parameters_json=parameters)]).SerializeToString())
            size += len(parameters)
            if size > _SURFACE_SLICE_CHARS:
                size = 0
                await asyncio.sleep(0)
        data = await join_bytes(parts)  # tens of MB: copied in a thread, without the GIL
        catalog.keep_surface_response(view, engaged, data)
        return data

    async def Exec(self, request_iterator: AsyncIterator[pb.ExecRequest], context: grpc.aio.ServicerContext) -> AsyncIterator[pb.ExecResponse]:  # noqa: N802
        async for item in self._leg_stream("exec", request_iterator, context, pb.ExecResponse):
            yield item

    async def Wait(self, request_iterator: AsyncIterator[pb.WaitRequest], context: grpc.aio.ServicerContext) -> AsyncIterator[pb.WaitResponse]:  # noqa: N802
        async for item in self._leg_stream("wait", request_iterator, context, pb.WaitResponse):
            yield item

    async def _leg_stream(self, kind: str, request_iterator: AsyncIterator[Any], context: grpc.aio.ServicerContext, response_type: Any) -> AsyncIterator[Any]:
        started = time.monotonic()
        iterator = request_iterator.__aiter__()
        start, scope = await _read_start(kind, iterator, context)
        # The wait's own tool-call id is `wait_tool_call_id`; `tool_call_id` stays the exec's (SPEC §13 item 5).
        ids = {"session_id": scope[0], "agent_run_id": scope[1], ("tool_call_id" if kind == "exec" else "wait_tool_call_id"): start.tool_call_id}
        structlog.contextvars.bind_contextvars(rpc=kind, **ids)
        bound = log.bind(rpc=kind, **ids)
        catalog = self._state.catalogs.get(scope)
        if kind == "exec" and catalog is None:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "this scope has no catalog; register one with CatalogService.PutCatalog first")
        refused = self._state.admission.try_acquire(scope)
        if refused is not None:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, refused)
        outbox: asyncio.Queue[Message | None] = asyncio.Queue()
        ports = StreamPorts(response_type, outbox, hosted=self._state.mcp_hub, settle=self._state.settle_hosted)
        # An exec's run keeps the catalog view of its start (SPEC §3.2 item 6); a wait's run has its own.
        view: CatalogPort | None = catalog.view() if catalog is not None and kind == "exec" else None
        # Without the scope's catalog here (another replica has it, or a restart lost it),
        # a wait reports the telemetry of the run's own view and session.
        telemetry_of: list[Telemetry] = [catalog.telemetry if catalog is not None else self._state.empty_telemetry]

        def telemetry() -> dict[str, Any]:
            return telemetry_of[0]()

        async def run_leg() -> LegReport:
            try:
                if kind == "exec":
                    assert view is not None
                    return await self._runner.exec(
                        session_id=scope[0],
                        agent_run_id=scope[1],
                        tool_call_id=start.tool_call_id,
                        turn_id=start.turn_id,
                        arguments_json=start.arguments_json,
                        force_restart_safe=start.force_restart_safe,
                        overrides=_overrides(start.limit_overrides),
                        view=view,
                        ports=ports,
                        telemetry=telemetry,
                    )

                def on_claim(run: Run) -> None:
                    if catalog is None and isinstance(run.view, RunCatalog):
                        telemetry_of[0] = run.view.telemetry

                return await self._runner.wait(
                    session_id=scope[0],
                    agent_run_id=scope[1],
                    arguments_json=start.arguments_json,
                    ports=ports,
                    telemetry=telemetry,
                    on_claim=on_claim,
                )
            finally:
                outbox.put_nowait(None)

        reader = asyncio.ensure_future(_read_runtime(iterator, ports, self._runner.cpu, scope, (kind, context)))
        leg = asyncio.ensure_future(run_leg())
        self._state.active_legs[id(leg)] = (scope, ports, leg)
        try:
            while True:
                item = await outbox.get()
                if item is None:
                    break
                yield item
            report = leg.result()
            if kind == "wait" and report.code is ErrorCode.ABORTED and self._state.registry is not None and self._state.registry.stopping:
                # Not the caller's abort: the run stays resumable; the runtime waits on it again elsewhere.
                await context.abort(grpc.StatusCode.UNAVAILABLE, "cellblock is shutting down; wait on the run again (on another replica, or after the restart)")
            yield response_type(result=await _result_message(report))
            annotate_rpc(kind, report)
            _log_completed(bound, report, started)
        finally:
            self._state.active_legs.pop(id(leg), None)
            self._state.admission.release(scope)
            reader.cancel()
            if not leg.done():
                # Transport cancellation: abort the leg and let it clean up.
                ports.cancel()
                with contextlib.suppress(Exception):
                    await asyncio.shield(leg)
                bound.info("rpc.cancelled", duration_ms=int((time.monotonic() - started) * 1000))
