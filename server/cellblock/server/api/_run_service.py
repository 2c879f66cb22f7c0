"""RunService: read and cancel runs of the caller's scope (SPEC §3.6)."""

from __future__ import annotations

import grpc
from google.protobuf import timestamp_pb2

from cellblock.server.api._scope import page_start, require_scope, require_short_ids
from cellblock.server.api._state import ServiceState
from cellblock.server.runs import RunRegistry, RunSummary
from cellblock.v1 import code_mode_service_pb2 as cpb
from cellblock.v1 import common_pb2
from cellblock.v1 import run_service_pb2 as pb
from cellblock.v1 import run_service_pb2_grpc as pb_grpc


def _timestamp(seconds: float) -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    ts.FromNanoseconds(int(seconds * 1e9))
    return ts


def run_message(run: RunSummary) -> pb.Run:
    """Describes a run; never includes snapshot contents."""
    suspended = run.state == "suspended"
    msg = pb.Run(
        run_id=run.run_id,
        scope=common_pb2.Scope(session_id=run.session_id, agent_run_id=run.agent_run_id),
        state=pb.RUN_STATE_SUSPENDED if suspended else pb.RUN_STATE_RUNNING,
        tool_call_id=run.tool_call_id,
        create_time=_timestamp(run.created_at),
        snapshot_bytes=run.snapshot_bytes if suspended else 0,
        pending_tool_calls=[pb.PendingToolCall(id=bridge_id, method=method, nested_call_id=nested) for bridge_id, method, nested in run.pending],
        bridge_calls=cpb.BridgeCallCounts(**{k: run.counts.get(k, 0) for k in ("search", "describe", "call")}),
        leg_count=run.legs,
    )
    if suspended:
        msg.expire_time.CopyFrom(_timestamp(run.expires_at))
    return msg


class RunService(pb_grpc.RunServiceServicer):
    """Reads and cancels runs of the caller's scope on every replica (they are read from the run store)."""

    def __init__(self, state: ServiceState, registry: RunRegistry) -> None:
        self._state = state
        self._registry = registry

    async def _find(self, scope: tuple[str, str], run_id: str, context: grpc.aio.ServicerContext) -> RunSummary:
        await require_short_ids(context, run_id=run_id)
        await self._registry.sweep()
        run = await self._registry.summary(run_id)
        if run is None or (run.session_id, run.agent_run_id) != scope:
            await context.abort(grpc.StatusCode.NOT_FOUND, "no such run in this scope (it may have ended or expired)")
        assert run is not None
        return run

    async def GetRun(self, request: pb.GetRunRequest, context: grpc.aio.ServicerContext) -> pb.GetRunResponse:  # noqa: N802
        scope = await require_scope(request.scope, context)
        return pb.GetRunResponse(run=run_message(await self._find(scope, request.run_id, context)))

    async def ListRuns(self, request: pb.ListRunsRequest, context: grpc.aio.ServicerContext) -> pb.ListRunsResponse:  # noqa: N802
        scope = await require_scope(request.scope, context)
        await self._registry.sweep()
        runs = await self._registry.of_scope(*scope)
        size = request.page_size if 0 < request.page_size <= 1000 else 100
        start = await page_start(request.page_token, context)
        page = runs[start : start + size]
        token = str(start + size) if start + size < len(runs) else ""
        return pb.ListRunsResponse(runs=[run_message(r) for r in page], next_page_token=token)

    async def CancelRun(self, request: pb.CancelRunRequest, context: grpc.aio.ServicerContext) -> pb.CancelRunResponse:  # noqa: N802
        scope = await require_scope(request.scope, context)
        record = await self._registry.record(request.run_id)
        if record is not None and record.state == "cancelled" and (record.session_id, record.agent_run_id) == scope:
            return pb.CancelRunResponse(previous_state=pb.RUN_STATE_UNSPECIFIED)
        run = await self._find(scope, request.run_id, context)
        local = self._registry.active.get(run.run_id)
        if local is not None:
            # An active leg here: abort it through its stream's event queue.
            for leg_scope, ports, _leg in list(self._state.active_legs.values()):
                if leg_scope == scope and getattr(ports, "run_id", None) == run.run_id:
                    ports.cancel()
            await self._registry.cancel(local)
            return pb.CancelRunResponse(previous_state=pb.RUN_STATE_RUNNING)
        # Suspended, or running on another replica (its leg sees the tombstone at its next lease renewal).
        await self._registry.cancel_id(run.run_id, run.session_id, run.agent_run_id, run.expires_at, self._state.config.snapshot_ttl_seconds)
        return pb.CancelRunResponse(previous_state=pb.RUN_STATE_SUSPENDED if run.state == "suspended" else pb.RUN_STATE_RUNNING)
