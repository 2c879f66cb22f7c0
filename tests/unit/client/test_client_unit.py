"""Unit tests of the Python client (`cellblock.client`).

These tests run a real in-process ``grpc.aio`` server, but its servicers are a
tiny FAKE written in this file: it is a unit test of the *client*, so the fake
only replays scripted stream shapes (ToolCall, Output, ToolCallCancelled,
Result) and status codes. Nothing here exercises the real cellblock server; the
lead's integration and interop tests do that.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import grpc.aio
import pytest
import pytest_asyncio

import cellblock.client
from cellblock.client import (
    CellblockClient,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    OutputEntry,
    ResourceExhaustedError,
    RPCError,
    Scope,
    ToolCallInfo,
    ToolRefused,
)
from cellblock.v1 import (
    catalog_service_pb2,
    catalog_service_pb2_grpc,
    code_mode_service_pb2,
    code_mode_service_pb2_grpc,
    common_pb2,
    run_service_pb2,
    run_service_pb2_grpc,
)

pytestmark = [pytest.mark.asyncio(loop_scope="function"), pytest.mark.timeout(30)]

SCOPE = Scope(session_id="sess-1", agent_run_id="agent-1")
RUN_ID = "run_" + "a" * 32
TELEMETRY = {
    "catalogSize": 2,
    "sources": {"host": 2, "mcp": 0, "client": 0},
    "searchCount": 0,
    "describeCount": 0,
    "callCount": 1,
    "counterScope": "0123456789ab",
    "visibleTools": ["exec", "wait"],
}


def completed(value: Any, output: list[dict[str, Any]] | None = None) -> code_mode_service_pb2.Result:
    body = {
        "status": "completed",
        "value": value,
        "output": output or [],
        "replaySafe": False,
        "telemetry": TELEMETRY,
    }
    return code_mode_service_pb2.Result(
        result_json=json.dumps(body),
        status=code_mode_service_pb2.RUN_STATUS_COMPLETED,
        trace_id="f" * 32,
        metadata=code_mode_service_pb2.RunMetadata(
            bridge_calls=code_mode_service_pb2.BridgeCallCounts(call=1), leg_count=1, cell_id="cell-1"
        ),
    )


def waiting() -> code_mode_service_pb2.Result:
    body = {
        "status": "waiting",
        "runId": RUN_ID,
        "reason": "pending_tools",
        "pendingToolCalls": [{"id": "bridge:callValue:1", "method": "callValue"}],
        "output": [],
        "replaySafe": False,
        "telemetry": TELEMETRY,
    }
    return code_mode_service_pb2.Result(
        result_json=json.dumps(body), status=code_mode_service_pb2.RUN_STATUS_WAITING, run_id=RUN_ID
    )


def aborted() -> code_mode_service_pb2.Result:
    body = {
        "status": "failed",
        "error": "The run was cancelled.",
        "code": "aborted",
        "failurePhase": "host",
        "bridgeDispatchStarted": True,
        "output": [],
        "replaySafe": False,
        "telemetry": TELEMETRY,
    }
    return code_mode_service_pb2.Result(
        result_json=json.dumps(body),
        status=code_mode_service_pb2.RUN_STATUS_FAILED,
        code=code_mode_service_pb2.ERROR_CODE_ABORTED,
    )


def tool_call(n: int, catalog_id: str, tool_input: Any) -> code_mode_service_pb2.ToolCall:
    owner, name = catalog_id.split(":")[1:]
    return code_mode_service_pb2.ToolCall(
        nested_call_id=f"cellblock_call_1_abcdef01_{n}",
        parent_tool_call_id="call_1",
        run_id=RUN_ID,
        replay_id="replay_" + "b" * 24,
        catalog_id=catalog_id,
        source=common_pb2.TOOL_SOURCE_HOST,
        owner=owner,
        name=name,
        method=code_mode_service_pb2.NESTED_CALL_METHOD_CALL_VALUE,
        input_json=json.dumps(tool_input),
    )


def result_value(tr: code_mode_service_pb2.ToolResult) -> Any:
    if tr.WhichOneof("outcome") == "ok_json":
        return {"ok": json.loads(tr.ok_json)}
    kind = code_mode_service_pb2.ToolErrorKind.Name(tr.error.kind)
    return {"error": kind, "message": tr.error.message}


@dataclass
class FakeState:
    """What the fake servicers saw, for assertions."""

    starts: list[Any] = field(default_factory=list)
    cancels: list[str] = field(default_factory=list)
    cancel_seen: asyncio.Event = field(default_factory=asyncio.Event)
    tool_results: list[code_mode_service_pb2.ToolResult] = field(default_factory=list)


class FakeCodeMode(code_mode_service_pb2_grpc.CodeModeServiceServicer):
    """Scripted fake: the exec arguments' `code` names the scenario."""

    def __init__(self, state: FakeState) -> None:
        self.state = state

    async def _read_results(self, context: Any, n: int) -> list[code_mode_service_pb2.ToolResult]:
        out = []
        while len(out) < n:
            req = await context.read()
            assert req is not grpc.aio.EOF
            kind = req.WhichOneof("message")
            if kind == "cancel":
                self.state.cancels.append(req.cancel.reason)
                self.state.cancel_seen.set()
                raise asyncio.CancelledError
            assert kind == "tool_result"
            self.state.tool_results.append(req.tool_result)
            out.append(req.tool_result)
        return out

    async def GetToolSurface(self, request: Any, context: Any) -> Any:  # noqa: N802
        return code_mode_service_pb2.GetToolSurfaceResponse(
            code_mode_engaged=request.model_id.startswith("anthropic/"),
            tools=[
                code_mode_service_pb2.ToolDefinition(
                    name="exec", description="Runs a program.", parameters_json='{"type":"object"}'
                ),
                code_mode_service_pb2.ToolDefinition(name="wait", description="Resumes.", parameters_json="{}"),
            ],
        )

    async def Exec(self, request_iterator: Any, context: Any) -> None:  # noqa: N802
        first = await context.read()
        if first.WhichOneof("message") != "start":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the first message must be start")
        start = first.start
        self.state.starts.append(start)
        if start.scope.agent_run_id == "no-catalog":
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "scope has no catalog; call PutCatalog first")
        if start.scope.agent_run_id == "busy":
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "too many legs; retry later")
        scenario = json.loads(start.arguments_json).get("code", "")
        try:
            await self._scenario(scenario, context)
        except asyncio.CancelledError:
            # The client sent Cancel: the aborted Result is still sent (SPEC §3.6).
            await context.write(code_mode_service_pb2.ExecResponse(result=aborted()))

    async def _scenario(self, scenario: str, context: Any) -> None:
        write = context.write
        resp = code_mode_service_pb2.ExecResponse
        if scenario == "echo":
            await write(resp(tool_call=tool_call(1, "host:shipping:shipping_list", {"region": "EU", "limit": 3})))
            (tr,) = await self._read_results(context, 1)
            await write(resp(result=completed(result_value(tr))))
        elif scenario == "concurrent":
            for n in range(1, 4):
                await write(resp(tool_call=tool_call(n, "host:billing:slow", {"n": n})))
            results = await self._read_results(context, 3)
            await write(resp(result=completed([result_value(r) for r in results])))
        elif scenario == "errors":
            await write(resp(tool_call=tool_call(1, "host:billing:boom", {})))
            await write(resp(tool_call=tool_call(2, "host:billing:refuse", {})))
            await write(resp(tool_call=tool_call(3, "host:billing:unknown_tool", {})))
            await write(resp(tool_call=tool_call(4, "host:billing:not_json", {})))
            results = await self._read_results(context, 4)
            by_id = {r.nested_call_id[-1]: result_value(r) for r in results}
            await write(resp(result=completed(by_id)))
        elif scenario == "output":
            await write(resp(output=code_mode_service_pb2.OutputEvent(entry_json='{"type":"text","text":"hi"}')))
            await write(resp(output=code_mode_service_pb2.OutputEvent(entry_json='{"type":"json","value":[1,2]}')))
            await write(
                resp(result=completed(None, [{"type": "text", "text": "hi"}, {"type": "json", "value": [1, 2]}]))
            )
        elif scenario == "pending":
            await write(resp(tool_call=tool_call(1, "host:shipping:slow_quote", {"tons": 12})))
            await write(resp(result=waiting()))
        elif scenario == "hang":
            await write(resp(tool_call=tool_call(1, "host:shipping:slow_quote", {"tons": 1})))
            await self._read_results(context, 1)
        elif scenario == "abandon":
            await write(resp(tool_call=tool_call(1, "host:shipping:slow_quote", {"tons": 1})))
            await asyncio.sleep(0.2)
            await write(
                resp(tool_call_cancelled=code_mode_service_pb2.ToolCallCancelled(nested_call_id=tool_call(1, "x:y:z", {}).nested_call_id))
            )
            await asyncio.sleep(0.3)
            await write(resp(result=completed("done")))
        elif scenario == "no_result":
            return
        else:
            raise AssertionError(f"unknown scenario {scenario!r}")

    async def Wait(self, request_iterator: Any, context: Any) -> None:  # noqa: N802
        first = await context.read()
        start = first.start
        self.state.starts.append(start)
        assert json.loads(start.arguments_json) == {"runId": RUN_ID}
        # The result of the call dispatched in the exec leg arrives on this stream.
        (tr,) = await self._read_results(context, 1)
        await context.write(code_mode_service_pb2.WaitResponse(result=completed(result_value(tr))))


class FakeCatalogs(catalog_service_pb2_grpc.CatalogServiceServicer):
    """Echoes registrations; GetCatalog is always NOT_FOUND."""

    async def PutCatalog(self, request: Any, context: Any) -> Any:  # noqa: N802
        for index, tool in enumerate(request.tools):
            if tool.name == "bad name":
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"tools[{index}]: name has whitespace")
        entries = [
            catalog_service_pb2.CatalogEntry(
                id=f"{common_pb2.ToolSource.Name(t.source).removeprefix('TOOL_SOURCE_').lower()}:{t.owner or 'core'}:{t.name}",
                tool=t,
            )
            for t in request.tools
        ]
        return catalog_service_pb2.PutCatalogResponse(
            catalog=catalog_service_pb2.Catalog(
                scope=request.scope,
                entries=sorted(entries, key=lambda e: e.id),
                telemetry=common_pb2.CatalogTelemetry(catalog_size=len(entries), counter_scope="0123456789ab"),
            )
        )

    async def GetCatalog(self, request: Any, context: Any) -> Any:  # noqa: N802
        await context.abort(grpc.StatusCode.NOT_FOUND, "scope sess-1/agent-1 has no catalog")


class FakeRuns(run_service_pb2_grpc.RunServiceServicer):
    """GetRun fails with the status code named by the run id."""

    async def GetRun(self, request: Any, context: Any) -> Any:  # noqa: N802
        await context.abort(grpc.StatusCode[request.run_id], f"scripted {request.run_id}")

    async def CancelRun(self, request: Any, context: Any) -> Any:  # noqa: N802
        return run_service_pb2.CancelRunResponse(previous_state=run_service_pb2.RUN_STATE_SUSPENDED)


@pytest_asyncio.fixture(loop_scope="function")
async def fake() -> AsyncIterator[tuple[FakeState, str]]:
    state = FakeState()
    server = grpc.aio.server()
    code_mode_service_pb2_grpc.add_CodeModeServiceServicer_to_server(FakeCodeMode(state), server)
    catalog_service_pb2_grpc.add_CatalogServiceServicer_to_server(FakeCatalogs(), server)
    run_service_pb2_grpc.add_RunServiceServicer_to_server(FakeRuns(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield state, f"127.0.0.1:{port}"
    finally:
        await server.stop(grace=None)


@pytest_asyncio.fixture(loop_scope="function")
async def client(fake: tuple[FakeState, str]) -> AsyncIterator[CellblockClient]:
    async with await CellblockClient.connect(fake[1], timeout=5) as c:
        yield c


# ---------------------------------------------------------------------------
# Public surface


async def test_exported_names_are_pinned() -> None:
    assert cellblock.client.__all__ == [
        "BridgeCallCounts",
        "Catalog",
        "CatalogEntry",
        "CatalogPage",
        "CatalogSummary",
        "CatalogTelemetry",
        "CellblockClient",
        "CellblockError",
        "DeadlineExceededError",
        "DeleteCatalogResult",
        "FailedPreconditionError",
        "InternalError",
        "InvalidArgumentError",
        "LimitOverrides",
        "NotFoundError",
        "OutputCallback",
        "OutputEntry",
        "PendingToolCall",
        "PermissionDeniedError",
        "ProtocolError",
        "RPCError",
        "ResourceExhaustedError",
        "Run",
        "RunMetadata",
        "RunPage",
        "RunResult",
        "Scope",
        "ScopeLike",
        "SourceCounts",
        "Telemetry",
        "Tool",
        "ToolCallInfo",
        "ToolDefinition",
        "ToolErrorKind",
        "ToolHandler",
        "ToolRefused",
        "ToolSurface",
        "UnavailableError",
        "from_grpc_error",
    ]
    for name in cellblock.client.__all__:
        assert getattr(cellblock.client, name) is not None


async def test_error_tree_and_registry() -> None:
    for cls, code in [
        (cellblock.client.InvalidArgumentError, grpc.StatusCode.INVALID_ARGUMENT),
        (cellblock.client.NotFoundError, grpc.StatusCode.NOT_FOUND),
        (cellblock.client.FailedPreconditionError, grpc.StatusCode.FAILED_PRECONDITION),
        (cellblock.client.ResourceExhaustedError, grpc.StatusCode.RESOURCE_EXHAUSTED),
        (cellblock.client.PermissionDeniedError, grpc.StatusCode.PERMISSION_DENIED),
        (cellblock.client.UnavailableError, grpc.StatusCode.UNAVAILABLE),
        (cellblock.client.DeadlineExceededError, grpc.StatusCode.DEADLINE_EXCEEDED),
        (cellblock.client.InternalError, grpc.StatusCode.INTERNAL),
    ]:
        assert issubclass(cls, RPCError)
        assert issubclass(cls, cellblock.client.CellblockError)
        assert cls.grpc_status_code is code
    assert issubclass(ToolRefused, cellblock.client.CellblockError)
    with pytest.raises(ValueError, match="unknown tool error kind"):
        ToolRefused("nope", "x")  # type: ignore[arg-type]


# ---------------------------------------------------------------------------
# Errors are mapped, never AioRpcError


@pytest.mark.parametrize(
    ("code", "exc_type"),
    [
        ("NOT_FOUND", NotFoundError),
        ("INVALID_ARGUMENT", InvalidArgumentError),
        ("FAILED_PRECONDITION", FailedPreconditionError),
        ("RESOURCE_EXHAUSTED", ResourceExhaustedError),
        ("PERMISSION_DENIED", cellblock.client.PermissionDeniedError),
        ("INTERNAL", cellblock.client.InternalError),
        ("UNAVAILABLE", cellblock.client.UnavailableError),
        ("DATA_LOSS", RPCError),
    ],
)
async def test_unary_status_codes_map_to_exceptions(
    client: CellblockClient, code: str, exc_type: type[RPCError]
) -> None:
    with pytest.raises(exc_type) as info:
        await client.get_run(SCOPE, code)
    assert type(info.value) is exc_type
    assert not isinstance(info.value, grpc.aio.AioRpcError)
    assert info.value.status is grpc.StatusCode[code]
    assert info.value.message == f"scripted {code}"


async def test_get_catalog_not_found(client: CellblockClient) -> None:
    with pytest.raises(NotFoundError, match="has no catalog"):
        await client.get_catalog(("sess-1", "agent-1"))


async def test_put_catalog_invalid_argument_and_roundtrip(client: CellblockClient) -> None:
    with pytest.raises(InvalidArgumentError, match=r"tools\[1\]"):
        await client.put_catalog(SCOPE, [{"source": "host", "name": "ok"}, {"source": "host", "name": "bad name"}])
    catalog = await client.put_catalog(
        SCOPE,
        [
            {
                "source": "host",
                "owner": "shipping",
                "name": "shipping_list",
                "parameters": {"type": "object", "properties": {}, "additionalProperties": False},
                "outputSchema": {"type": "array", "items": {"type": "string"}},
                "replaySafe": True,
            },
            cellblock.client.Tool(source="client", owner="app", name="select_file"),
        ],
    )
    assert catalog.ids == ["client:app:select_file", "host:shipping:shipping_list"]
    tool = catalog.get("host:shipping:shipping_list")
    assert tool is not None
    assert tool.output_schema == {"type": "array", "items": {"type": "string"}}
    assert tool.replay_safe
    assert catalog.telemetry.counter_scope == "0123456789ab"


async def test_exec_failed_precondition_and_resource_exhausted(client: CellblockClient) -> None:
    with pytest.raises(FailedPreconditionError, match="PutCatalog"):
        await client.exec(Scope("sess-1", "no-catalog"), tool_call_id="call_1", code="echo")
    with pytest.raises(ResourceExhaustedError):
        await client.exec(Scope("sess-1", "busy"), tool_call_id="call_1", code="echo")


async def test_connect_unreachable_is_unavailable() -> None:
    with pytest.raises(cellblock.client.UnavailableError, match="not reachable"):
        await CellblockClient.connect("unix:/nonexistent/cellblock.sock", timeout=0.3)


async def test_stream_without_result_is_protocol_error(client: CellblockClient) -> None:
    with pytest.raises(cellblock.client.ProtocolError):
        await client.exec(SCOPE, tool_call_id="call_1", code="no_result")


# ---------------------------------------------------------------------------
# Exec and nested calls


async def test_handler_receives_input_and_call_info(fake: tuple[FakeState, str], client: CellblockClient) -> None:
    seen: list[tuple[dict[str, Any], ToolCallInfo]] = []

    async def shipping_list(tool_input: dict[str, Any], call: ToolCallInfo) -> dict[str, Any]:
        seen.append((tool_input, call))
        return {"content": [{"type": "text", "text": "2 shipments"}], "details": [{"id": "S1"}]}

    result = await client.exec(
        SCOPE,
        tool_call_id="call_1",
        arguments={"code": "echo", "language": "javascript"},
        handlers={"host:shipping:shipping_list": shipping_list},
        turn_id="turn-7",
        limits=cellblock.client.LimitOverrides(timeout_ms=5000),
    )
    assert seen[0][0] == {"region": "EU", "limit": 3}
    info = seen[0][1]
    assert info.catalog_id == "host:shipping:shipping_list"
    assert (info.source, info.owner, info.name, info.method) == ("host", "shipping", "shipping_list", "callValue")
    assert info.run_id == RUN_ID
    assert info.parent_tool_call_id == "call_1"
    assert result.status == "completed"
    assert result.ok
    assert result.value == {"ok": {"content": [{"type": "text", "text": "2 shipments"}], "details": [{"id": "S1"}]}}
    assert json.loads(result.raw_json)["status"] == "completed"
    assert result.telemetry.counter_scope == "0123456789ab"
    assert result.telemetry.sources.host == 2
    assert result.telemetry.visible_tools == ("exec", "wait")
    assert result.trace_id == "f" * 32
    assert result.metadata.bridge_calls.call == 1
    assert result.metadata.cell_id == "cell-1"
    start = fake[0].starts[0]
    assert json.loads(start.arguments_json) == {"code": "echo", "language": "javascript"}
    assert start.turn_id == "turn-7"
    assert start.limit_overrides.timeout_ms == 5000
    assert not start.limit_overrides.HasField("memory_limit_bytes")


async def test_handlers_by_name_and_raw_arguments(client: CellblockClient) -> None:
    async def by_name(tool_input: dict[str, Any], call: ToolCallInfo) -> list[int]:
        return [tool_input["limit"]]

    result = await client.exec(
        SCOPE, tool_call_id="call_1", arguments='{"code":"echo"}', handlers={"shipping_list": by_name}
    )
    assert result.value == {"ok": [3]}


async def test_concurrent_tool_calls_run_concurrently(client: CellblockClient) -> None:
    started: list[int] = []
    all_started = asyncio.Event()

    async def slow(tool_input: dict[str, Any], call: ToolCallInfo) -> dict[str, Any]:
        started.append(tool_input["n"])
        if len(started) == 3:
            all_started.set()
        # Completes only once all three handlers are running at the same time.
        await asyncio.wait_for(all_started.wait(), timeout=5)
        return {"details": tool_input["n"] * 10}

    result = await client.exec(SCOPE, tool_call_id="call_1", code="concurrent", handlers={"slow": slow})
    assert sorted(started) == [1, 2, 3]
    assert sorted(v["ok"]["details"] for v in result.value) == [10, 20, 30]


async def test_handler_errors_become_tool_error_results(client: CellblockClient) -> None:
    async def boom(tool_input: dict[str, Any], call: ToolCallInfo) -> None:
        raise RuntimeError("warehouse database is down")

    async def refuse(tool_input: dict[str, Any], call: ToolCallInfo) -> None:
        raise ToolRefused("blocked", "needs approval from billing")

    async def not_json(tool_input: dict[str, Any], call: ToolCallInfo) -> object:
        return object()

    result = await client.exec(
        SCOPE,
        tool_call_id="call_1",
        code="errors",
        handlers={"host:billing:boom": boom, "refuse": refuse, "not_json": not_json},
    )
    assert result.value["1"] == {"error": "TOOL_ERROR_KIND_FAILED", "message": "warehouse database is down"}
    assert result.value["2"] == {"error": "TOOL_ERROR_KIND_BLOCKED", "message": "needs approval from billing"}
    assert result.value["3"] == {
        "error": "TOOL_ERROR_KIND_FAILED",
        "message": "no handler registered for host:billing:unknown_tool",
    }
    assert result.value["4"]["error"] == "TOOL_ERROR_KIND_FAILED"
    assert "JSON" in result.value["4"]["message"]


async def test_output_events_reach_on_output(client: CellblockClient) -> None:
    entries: list[OutputEntry] = []

    async def on_output(entry: OutputEntry) -> None:
        entries.append(entry)

    result = await client.exec(SCOPE, tool_call_id="call_1", code="output", on_output=on_output)
    assert [(e.type, e.text, e.value) for e in entries] == [("text", "hi", None), ("json", None, [1, 2])]
    assert result.output == entries
    assert result.value is None


async def test_pending_call_result_is_sent_on_next_wait(fake: tuple[FakeState, str], client: CellblockClient) -> None:
    release = asyncio.Event()

    async def slow_quote(tool_input: dict[str, Any], call: ToolCallInfo) -> dict[str, Any]:
        await release.wait()
        return {"details": {"price": tool_input["tons"] * 100}}

    first = await client.exec(SCOPE, tool_call_id="call_1", code="pending", handlers={"slow_quote": slow_quote})
    assert first.status == "waiting"
    assert first.run_id == RUN_ID
    assert first.reason == "pending_tools"
    assert [p.method for p in first.pending_tool_calls] == ["callValue"]
    release.set()  # settles between the legs
    await asyncio.sleep(0.05)
    second = await client.wait(SCOPE, tool_call_id="call_2", run_id=first.run_id)
    assert second.status == "completed"
    assert second.value == {"ok": {"details": {"price": 1200}}}


async def test_caller_cancellation_sends_cancel(fake: tuple[FakeState, str], client: CellblockClient) -> None:
    handler_cancelled = asyncio.Event()

    async def slow_quote(tool_input: dict[str, Any], call: ToolCallInfo) -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            handler_cancelled.set()
            raise

    task = asyncio.create_task(
        client.exec(SCOPE, tool_call_id="call_1", code="hang", handlers={"slow_quote": slow_quote})
    )
    await asyncio.sleep(0.3)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.wait_for(fake[0].cancel_seen.wait(), timeout=5)
    assert fake[0].cancels == ["client cancelled the leg"]
    await asyncio.wait_for(handler_cancelled.wait(), timeout=5)


async def test_tool_call_cancelled_cancels_handler(fake: tuple[FakeState, str], client: CellblockClient) -> None:
    handler_cancelled = asyncio.Event()

    async def slow_quote(tool_input: dict[str, Any], call: ToolCallInfo) -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            handler_cancelled.set()
            raise

    result = await client.exec(SCOPE, tool_call_id="call_1", code="abandon", handlers={"slow_quote": slow_quote})
    assert result.value == "done"
    assert handler_cancelled.is_set()
    assert fake[0].tool_results == []  # nothing is sent for an abandoned call


async def test_tool_surface_and_cancel_run(client: CellblockClient) -> None:
    surface = await client.tool_surface(SCOPE, "anthropic/claude-opus-5")
    assert surface.code_mode_engaged
    assert [t.name for t in surface.tools] == ["exec", "wait"]
    assert surface.tools[0].parameters == {"type": "object"}
    assert await client.cancel_run(SCOPE, RUN_ID) == "suspended"


async def test_exec_argument_validation(client: CellblockClient) -> None:
    with pytest.raises(ValueError, match="exactly one"):
        await client.exec(SCOPE, tool_call_id="c", code="x", arguments={"code": "x"})
    with pytest.raises(ValueError, match="exactly one"):
        await client.exec(SCOPE, tool_call_id="c")
