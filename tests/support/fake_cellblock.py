"""A FAKE cellblock service for the client's unit tests (tests/unit/client).

Its servicers only replay scripted stream shapes (ToolCall, Output, ToolCallCancelled, Result)
and status codes over a real in-process ``grpc.aio`` server: a unit test of the *client* needs
no real cellblock server (the integration and interop tests run the real one).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
import grpc.aio

from cellblock.client import Scope
from cellblock.v1 import (
    catalog_service_pb2,
    catalog_service_pb2_grpc,
    code_mode_service_pb2,
    code_mode_service_pb2_grpc,
    common_pb2,
    run_service_pb2,
    run_service_pb2_grpc,
)

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


@contextlib.asynccontextmanager
async def serving(register: Callable[[grpc.aio.Server], None]) -> AsyncIterator[str]:
    """An in-process ``grpc.aio`` server on a free local port with the servicers `register` adds.

    Yields:
        The server's address, ``127.0.0.1:<port>``; the server stops when the block ends.
    """
    server = grpc.aio.server()
    register(server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(grace=None)
