"""Unit tests of the Python client (`cellblock.client`).

These tests run a real in-process ``grpc.aio`` server, but its servicers are a
tiny FAKE (tests/support/fake_cellblock.py): it is a unit test of the *client*, so the fake
only replays scripted stream shapes (ToolCall, Output, ToolCallCancelled,
Result) and status codes. Nothing here exercises the real cellblock server; the
lead's integration and interop tests do that.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import grpc
import grpc.aio
import pytest

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
from tests.support.fake_cellblock import RUN_ID, SCOPE, FakeState

pytestmark = [pytest.mark.asyncio(loop_scope="function"), pytest.mark.timeout(30)]

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


async def test_values_too_deep_to_encode_raise_value_error_not_recursion_error(client: CellblockClient) -> None:
    # 100,000 levels: past Python's JSON encoder's recursion limit (found by a fresh user's review).
    deep: Any = {}
    for _ in range(100_000):
        deep = {"a": deep}
    with pytest.raises(ValueError, match=r"tool 'deep': parameters nests too deeply"):
        await client.put_catalog(SCOPE, [cellblock.client.Tool(source="host", owner="core", name="deep", parameters=deep)])
    with pytest.raises(ValueError, match=r"tool 'deep': output_schema nests too deeply"):
        await client.put_catalog(SCOPE, [cellblock.client.Tool(source="host", owner="core", name="deep", output_schema=deep)])
    with pytest.raises(ValueError, match="the arguments nest too deeply"):
        await client.exec(SCOPE, tool_call_id="call_1", arguments={"code": "echo", "x": deep})
