"""Typed values of exec/wait legs and runs: limit overrides, tool calls, output, results, runs.

Built from the service's messages by the client (users build only `LimitOverrides`); see
``_types`` for scopes, tools and catalogs.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from cellblock.client._types import _SOURCE_FROM_PROTO, RunStateName, RunStatusName, Scope
from cellblock.v1 import code_mode_service_pb2, run_service_pb2

__all__ = [
    "BridgeCallCounts",
    "LimitOverrides",
    "OutputEntry",
    "PendingToolCall",
    "Run",
    "RunMetadata",
    "RunPage",
    "RunResult",
    "SourceCounts",
    "Telemetry",
    "ToolCallInfo",
]

_METHOD_FROM_PROTO = {
    code_mode_service_pb2.NESTED_CALL_METHOD_CALL: "call",
    code_mode_service_pb2.NESTED_CALL_METHOD_CALL_VALUE: "callValue",
    code_mode_service_pb2.NESTED_CALL_METHOD_NAMESPACE: "namespace",
}

_RUN_STATE_FROM_PROTO: dict[int, RunStateName] = {
    run_service_pb2.RUN_STATE_RUNNING: "running",
    run_service_pb2.RUN_STATE_SUSPENDED: "suspended",
}


# ---------------------------------------------------------------------------
# Exec / wait


@dataclass(frozen=True)
class LimitOverrides:
    """Per-exec limit overrides (SPEC §2.1 item 6).

    ``None`` means the configured value; the service clamps valid values to the
    ranges of SPEC §2.2. A run keeps its exec's limits for all of its waits.
    """

    timeout_ms: int | None = None
    """Wall time of each leg in milliseconds, 100..60000."""
    memory_limit_bytes: int | None = None
    """Engine heap limit in bytes, 1048576..1073741824."""
    max_output_bytes: int | None = None
    """Output budget of the whole run in bytes, 1024..10485760."""
    max_snapshot_bytes: int | None = None
    """Largest snapshot in bytes, 1024..268435456."""
    max_pending_tool_calls: int | None = None
    """Most outstanding host requests at once, 1..128."""
    snapshot_ttl_seconds: int | None = None
    """Lifetime of a suspended run in seconds, 1..86400."""

    def _to_proto(self) -> code_mode_service_pb2.LimitOverrides:
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return code_mode_service_pb2.LimitOverrides(**{k: v for k, v in values.items() if v is not None})


@dataclass(frozen=True)
class ToolCallInfo:
    """The context of one nested call, passed to a tool handler next to its input."""

    nested_call_id: str
    """``cellblock_<P>_<R>_<n>``; unique within the run."""
    parent_tool_call_id: str
    """The tool-call id of the run's ``exec``, in every leg."""
    run_id: str
    """``run_`` plus 32 lower-case hex digits."""
    replay_id: str
    """``replay_`` plus 24 lower-case hex digits."""
    catalog_id: str
    """The resolved catalog id, e.g. ``host:shipping:shipping_list``."""
    source: str
    """``host``, ``mcp`` or ``client``."""
    owner: str
    """The tool's owner (for mcp, the server name)."""
    name: str
    """The tool name."""
    method: str
    """The guest helper: ``call``, ``callValue`` or ``namespace``."""

    @classmethod
    def _from_proto(cls, msg: code_mode_service_pb2.ToolCall) -> ToolCallInfo:
        return cls(
            nested_call_id=msg.nested_call_id,
            parent_tool_call_id=msg.parent_tool_call_id,
            run_id=msg.run_id,
            replay_id=msg.replay_id,
            catalog_id=msg.catalog_id,
            source=_SOURCE_FROM_PROTO.get(msg.source, "unspecified"),
            owner=msg.owner,
            name=msg.name,
            method=_METHOD_FROM_PROTO.get(msg.method, "unspecified"),
        )


@dataclass(frozen=True)
class OutputEntry:
    """One output entry of a run (SPEC §10.5 ``OutputEntry``)."""

    type: str
    """``"text"``, ``"json"`` or ``"truncated"``."""
    text: str | None = None
    """The text of a ``text`` entry."""
    value: Any = None
    """The value of a ``json`` entry."""
    omitted_bytes: int = 0
    """``truncated`` only: bytes left out."""
    omitted_entries: int = 0
    """``truncated`` only: entries left out."""
    guidance: str = ""
    """``truncated`` only: what the model should do about it."""
    prefix: str = ""
    """``truncated`` only: the kept prefix of the cut entry."""

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> OutputEntry:
        """Builds an entry from its JSON object."""
        return cls(
            type=str(data.get("type", "")),
            text=data.get("text"),
            value=data.get("value"),
            omitted_bytes=int(data.get("omittedBytes", 0)),
            omitted_entries=int(data.get("omittedEntries", 0)),
            guidance=str(data.get("guidance", "")),
            prefix=str(data.get("prefix", "")),
        )


@dataclass(frozen=True)
class SourceCounts:
    """Catalog entries by source."""

    host: int = 0
    """``host`` entries."""
    mcp: int = 0
    """``mcp`` entries."""
    client: int = 0
    """``client`` entries."""


@dataclass(frozen=True)
class Telemetry:
    """The ``telemetry`` of a result object (SPEC §12 item 1)."""

    catalog_size: int = 0
    """Entries of the run's catalog view, all sources."""
    sources: SourceCounts = field(default_factory=SourceCounts)
    """Entries by source."""
    search_count: int = 0
    """Cumulative ``tools.search`` requests of the catalog session."""
    describe_count: int = 0
    """Cumulative ``tools.describe`` requests of the catalog session."""
    call_count: int = 0
    """Cumulative nested call requests of the catalog session."""
    counter_scope: str = ""
    """12 lower-case hex digits naming the counter lifetime."""
    visible_tools: tuple[str, ...] = ()
    """Always ``("exec", "wait")``."""

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> Telemetry:
        """Builds telemetry from its JSON object; missing keys keep their defaults."""
        if not isinstance(data, Mapping):
            return cls()
        sources = data.get("sources") if isinstance(data.get("sources"), Mapping) else {}
        assert isinstance(sources, Mapping)
        return cls(
            catalog_size=int(data.get("catalogSize", 0)),
            sources=SourceCounts(
                host=int(sources.get("host", 0)),
                mcp=int(sources.get("mcp", 0)),
                client=int(sources.get("client", 0)),
            ),
            search_count=int(data.get("searchCount", 0)),
            describe_count=int(data.get("describeCount", 0)),
            call_count=int(data.get("callCount", 0)),
            counter_scope=str(data.get("counterScope", "")),
            visible_tools=tuple(data.get("visibleTools", ())),
        )


@dataclass(frozen=True)
class PendingToolCall:
    """A bridge request whose result the guest has not yet received."""

    id: str
    """The bridge id, ``bridge:<method>:<n>``."""
    method: str
    """``search``, ``describe``, ``call``, ``callValue``, ``namespace``, ``yield`` or ``timer``."""
    nested_call_id: str = ""
    """The nested call id of a dispatched call; empty otherwise and in result objects."""


@dataclass(frozen=True)
class BridgeCallCounts:
    """One run's bridge requests by kind."""

    search: int = 0
    """``tools.search`` requests."""
    describe: int = 0
    """``tools.describe`` requests."""
    call: int = 0
    """Nested call requests (call, callValue, namespace)."""

    @classmethod
    def _from_proto(cls, msg: code_mode_service_pb2.BridgeCallCounts) -> BridgeCallCounts:
        return cls(search=msg.search, describe=msg.describe, call=msg.call)


@dataclass(frozen=True)
class RunMetadata:
    """Run information for the runtime, not the model (SPEC §12 item 3)."""

    bridge_calls: BridgeCallCounts = field(default_factory=BridgeCallCounts)
    """This run's bridge requests, all legs together."""
    leg_count: int = 0
    """Legs run so far, this one included."""
    snapshot_bytes: int = 0
    """Compressed size in bytes of the run's last snapshot; 0 when never suspended."""
    cell_id: str = ""
    """The cell (container) that ran this leg; empty when no cell started."""

    @classmethod
    def _from_proto(cls, msg: code_mode_service_pb2.RunMetadata) -> RunMetadata:
        return cls(
            bridge_calls=BridgeCallCounts._from_proto(msg.bridge_calls),
            leg_count=msg.leg_count,
            snapshot_bytes=msg.snapshot_bytes,
            cell_id=msg.cell_id,
        )


@dataclass(frozen=True)
class RunResult:
    """The outcome of one ``exec`` or ``wait`` leg (SPEC §10.5).

    A failed run is a value, not an exception: check ``status``. Return
    ``raw_json`` to the model verbatim as the tool result text.
    """

    status: RunStatusName
    """``"completed"``, ``"waiting"`` or ``"failed"``."""
    raw_json: str
    """The model-facing result object as JSON text; return it to the model verbatim."""
    value: Any = None
    """Completed only: the program's return value (``None`` for JSON null)."""
    output: list[OutputEntry] = field(default_factory=list)
    """Output entries of this leg, possibly empty."""
    code: str | None = None
    """Failed only: the error code, e.g. ``"invalid_input"``, ``"timeout"``."""
    error: str | None = None
    """Failed only: the error message."""
    failure_phase: str | None = None
    """Failed only: ``"input"``, ``"guest"``, ``"bridge"`` or ``"host"``."""
    bridge_dispatch_started: bool = False
    """Failed only: whether any nested call of the run was dispatched."""
    run_id: str | None = None
    """Waiting only: the id to pass to `CellblockClient.wait`."""
    reason: str | None = None
    """Waiting only: ``"pending_tools"`` or ``"yield"``."""
    pending_tool_calls: list[PendingToolCall] = field(default_factory=list)
    """Waiting only: the requests whose results the guest has not yet received."""
    replay_safe: bool = False
    """Whether the run may be replayed after a service restart."""
    telemetry: Telemetry = field(default_factory=Telemetry)
    """Catalog size and cumulative counters."""
    trace_id: str = ""
    """The W3C trace id of this leg; empty when tracing is off."""
    metadata: RunMetadata = field(default_factory=RunMetadata)
    """Run metadata (bridge call counts, legs, snapshot size, cell id)."""

    @property
    def ok(self) -> bool:
        """Whether the run completed."""
        return self.status == "completed"

    @classmethod
    def _from_proto(cls, msg: code_mode_service_pb2.Result) -> RunResult:
        try:
            data = json.loads(msg.result_json)
        except ValueError:
            data = None
        if not isinstance(data, dict):
            data = {}
        status: Any = data.get("status") or {
            code_mode_service_pb2.RUN_STATUS_COMPLETED: "completed",
            code_mode_service_pb2.RUN_STATUS_WAITING: "waiting",
            code_mode_service_pb2.RUN_STATUS_FAILED: "failed",
        }.get(msg.status, "failed")
        return cls(
            status=status,
            raw_json=msg.result_json,
            value=data.get("value"),
            output=[OutputEntry.from_json(e) for e in data.get("output") or () if isinstance(e, Mapping)],
            code=data.get("code"),
            error=data.get("error"),
            failure_phase=data.get("failurePhase"),
            bridge_dispatch_started=bool(data.get("bridgeDispatchStarted", False)),
            run_id=data.get("runId") or msg.run_id or None,
            reason=data.get("reason"),
            pending_tool_calls=[
                PendingToolCall(id=str(p.get("id", "")), method=str(p.get("method", "")))
                for p in data.get("pendingToolCalls") or ()
                if isinstance(p, Mapping)
            ],
            replay_safe=bool(data.get("replaySafe", False)),
            telemetry=Telemetry.from_json(data.get("telemetry")),
            trace_id=msg.trace_id,
            metadata=RunMetadata._from_proto(msg.metadata),
        )


# ---------------------------------------------------------------------------
# Runs


def _timestamp(msg: Any, present: bool) -> datetime | None:
    if not present:
        return None
    return datetime.fromtimestamp(msg.seconds + msg.nanos / 1e9, tz=UTC)


@dataclass(frozen=True)
class Run:
    """One running or suspended run (RunService)."""

    run_id: str
    """``run_`` plus 32 lower-case hex digits."""
    scope: Scope
    """The owning scope."""
    state: RunStateName
    """``"running"`` (a leg is in flight) or ``"suspended"`` (only the snapshot exists)."""
    tool_call_id: str
    """The tool-call id of the run's ``exec``."""
    create_time: datetime | None
    """When the exec started (UTC)."""
    expire_time: datetime | None
    """When a suspended run expires (UTC); ``None`` while running."""
    snapshot_bytes: int
    """Compressed snapshot size in bytes; 0 while running."""
    pending_tool_calls: list[PendingToolCall]
    """Requests whose results the guest has not received, in bridge-id order."""
    bridge_calls: BridgeCallCounts
    """Bridge requests of the run so far."""
    leg_count: int
    """Legs run so far."""

    @classmethod
    def _from_proto(cls, msg: run_service_pb2.Run) -> Run:
        return cls(
            run_id=msg.run_id,
            scope=Scope._from_proto(msg.scope),
            state=_RUN_STATE_FROM_PROTO.get(msg.state, "unspecified"),
            tool_call_id=msg.tool_call_id,
            create_time=_timestamp(msg.create_time, msg.HasField("create_time")),
            expire_time=_timestamp(msg.expire_time, msg.HasField("expire_time")),
            snapshot_bytes=msg.snapshot_bytes,
            pending_tool_calls=[
                PendingToolCall(id=p.id, method=p.method, nested_call_id=p.nested_call_id)
                for p in msg.pending_tool_calls
            ],
            bridge_calls=BridgeCallCounts._from_proto(msg.bridge_calls),
            leg_count=msg.leg_count,
        )


@dataclass(frozen=True)
class RunPage:
    """One page of `CellblockClient.list_runs`."""

    runs: list[Run]
    """The runs of this page, oldest first."""
    next_page_token: str
    """Token for the next page; empty on the last page."""
