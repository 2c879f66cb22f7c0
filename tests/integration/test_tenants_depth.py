"""Nesting depth and malformed protos get a bounded, documented outcome (issue 11 item 2).

Every JSON path (the final value, tool inputs, tool results, output entries, schemas)
is driven to depth 100,000 in a real cell against the real service; each ends with a
specific result or status, never gRPC ``UNKNOWN`` with a Python class name and never a
run left ``RUNNING``.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from cellblock.client import CellblockClient, Scope, Tool
from cellblock.v1 import code_mode_service_pb2 as cpb
from cellblock.v1 import common_pb2

pytestmark = pytest.mark.asyncio(loop_scope="session")

# 1500 and 3000: the guest serialises it, the host's own JSON parser and writer (C code, bounded by
# the interpreter's recursion limit of 1000) cannot. Below about 1000 levels the host handles a value
# (test_a_value_below_the_host_limit_round_trips); the Python writer it used before stopped near 500.
DEPTHS = [1500, 3000, 100_000]
NEST = "let v = 0; for (let i = 0; i < %d; i++) v = [v]; "


async def _exec(client: CellblockClient, scope: Scope, code: str, handlers: dict[str, Any] | None = None) -> Any:
    await client.put_catalog(scope, [Tool(source="host", owner="core", name="echo"), Tool(source="client", owner="app", name="deep")])
    return await asyncio.wait_for(client.exec(scope, tool_call_id="deep", code=code, handlers=handlers or {}), timeout=60)


async def _no_run_left(client: CellblockClient, scope: Scope) -> None:
    runs = await client.list_runs(scope)
    assert [r for r in runs.runs if r.state == "running"] == [], runs


@pytest.mark.parametrize("depth", DEPTHS)
async def test_a_deep_final_value_ends_with_a_result(client: CellblockClient, scope: Scope, depth: int) -> None:
    result = await _exec(client, scope, NEST % depth + "return v;")
    # Deeper than the host serialiser: [R15]; deeper than the engine's stack: [R10] from the cell.
    assert result.status == "failed", result.raw_json
    assert (result.code, result.error[:40]) in (
        ("output_limit_exceeded", "output limit exceeded: the return value "),
        ("runtime_unavailable", "cell engine stopped: recursion exhausted"),
    ), result.raw_json
    await _no_run_left(client, scope)


async def test_a_value_below_the_host_limit_round_trips(client: CellblockClient, scope: Scope) -> None:
    result = await _exec(client, scope, NEST % 500 + "return v;")
    assert result.status == "completed", result.raw_json
    value, depth = result.value, 0
    while isinstance(value, list):
        value, depth = value[0], depth + 1
    assert (depth, value) == (500, 0)


@pytest.mark.parametrize("depth", DEPTHS)
async def test_a_deep_tool_input_is_refused_to_the_guest(client: CellblockClient, scope: Scope, depth: int) -> None:
    calls: list[Any] = []

    async def echo(tool_input: Any, call: Any) -> Any:
        calls.append(tool_input)
        return {"details": "ok"}

    code = NEST % depth + 'try { await tools.callValue("host:core:echo", {v}); return "called"; } catch (e) { return "refused: " + e.message; }'
    result = await _exec(client, scope, code, {"echo": echo})
    if depth < 100_000:
        # The guest serialises it; the host refuses it with [B23] and calls nothing.
        assert result.status == "completed", result.raw_json
        assert result.value == "refused: this callValue request is nested too deeply for the bridge; send flatter data.", result.value
        assert calls == []
    else:
        # Too deep for the engine's own serialiser: [R10] from the cell, nothing called.
        assert (result.code, result.error[:40]) == ("runtime_unavailable", "cell engine stopped: recursion exhausted"), result.raw_json
        assert calls == []
    await _no_run_left(client, scope)


@pytest.mark.parametrize("depth", DEPTHS)
async def test_a_deep_tool_result_is_refused_to_the_guest(client: CellblockClient, scope: Scope, depth: int) -> None:
    async def deep(tool_input: Any, call: Any) -> Any:
        return {"details": "[" * depth + "]" * depth}  # a string: the runtime sends text, nesting comes from JSON below

    async def deep_json(tool_input: Any, call: Any) -> Any:
        value: Any = 0
        for _ in range(min(depth, 900)):
            value = [value]
        return {"details": value}

    code = 'try { const r = await tools.callValue("client:app:deep", {}); return typeof r; } catch (e) { return "refused: " + e.message; }'
    for handler in (deep, deep_json):
        result = await _exec(client, scope, code, {"client:app:deep": handler})
        assert result.status == "completed", result.raw_json
    await _no_run_left(client, scope)


@pytest.mark.parametrize("depth", DEPTHS)
async def test_deep_output_is_bounded(client: CellblockClient, scope: Scope, depth: int) -> None:
    result = await _exec(client, scope, NEST % depth + 'try { json(v); } catch (e) { text("json refused: " + e.message); } return 1;')
    assert result.status in ("completed", "failed"), result.raw_json
    if result.status == "failed":
        assert result.code != "internal_error" or "service failed" not in result.error, result.raw_json
    if depth < 100_000:
        # Serialised by the guest, too deep for the host: the entry is dropped, the leg carries on.
        assert (result.status, result.value) == ("completed", 1), result.raw_json
    await _no_run_left(client, scope)


async def test_invalid_utf8_in_a_proto_string_is_invalid_argument(service: Any, scope: Scope) -> None:
    # tool_call_id is field 2 of ExecStart; write its bytes by hand with an invalid UTF-8 byte.
    start = cpb.ExecStart(scope=common_pb2.Scope(session_id=scope.session_id, agent_run_id=scope.agent_run_id), arguments_json='{"code":"return 1"}')
    raw = start.SerializeToString() + b"\x12\x02\xff\xfe"
    body = b"\x0a" + _varint(len(raw)) + raw  # ExecRequest.start = field 1

    async with grpc.aio.insecure_channel(service.address) as channel:
        call = channel.stream_stream("/cellblock.v1.CodeModeService/Exec", request_serializer=lambda b: b, response_deserializer=lambda b: b)

        async def requests() -> Any:
            yield body

        with pytest.raises(grpc.aio.AioRpcError) as raised:
            async for _ in call(requests()):
                pass
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT, raised.value
    assert "RecursionError" not in (raised.value.details() or "") and "Error" not in (raised.value.details() or "")


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


async def test_invalid_utf8_in_a_unary_request_is_invalid_argument(service: Any, scope: Scope) -> None:
    from cellblock.v1 import catalog_service_pb2 as pb  # noqa: PLC0415

    good = pb.PutCatalogRequest(scope=common_pb2.Scope(session_id=scope.session_id, agent_run_id=scope.agent_run_id)).SerializeToString()
    tool = pb.Tool(source=common_pb2.TOOL_SOURCE_HOST, name="x").SerializeToString().replace(b"x", b"\xff")
    body = good + b"\x12" + _varint(len(tool)) + tool  # PutCatalogRequest.tools = field 2
    async with grpc.aio.insecure_channel(service.address) as channel:
        call = channel.unary_unary("/cellblock.v1.CatalogService/PutCatalog", request_serializer=lambda b: b, response_deserializer=lambda b: b)
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await call(body)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT, raised.value
    assert raised.value.details() == "the request message could not be decoded (a string field is not valid UTF-8, or a field is malformed)."


async def test_an_undecodable_message_mid_stream_ends_the_leg_and_parks_nothing(service: Any, client: CellblockClient, scope: Scope) -> None:
    # The runtime answers the program's tool call with a ToolResult whose nested_call_id is not UTF-8.
    await client.put_catalog(scope, [Tool(source="host", owner="core", name="echo")])
    start = cpb.ExecRequest(start=cpb.ExecStart(scope=common_pb2.Scope(session_id=scope.session_id, agent_run_id=scope.agent_run_id), tool_call_id="mid", arguments_json='{"code":"await tools.callValue(\\"host:core:echo\\", {}); return 1"}'))
    bad = b"\x12\x04\x0a\x02\xff\xfe"  # ExecRequest.tool_result (2) { nested_call_id (1): 0xff 0xfe }
    queue: asyncio.Queue[bytes] = asyncio.Queue()
    await queue.put(start.SerializeToString())

    async def requests() -> Any:
        while True:
            yield await queue.get()

    started = asyncio.get_running_loop().time()
    async with grpc.aio.insecure_channel(service.address) as channel:
        call = channel.stream_stream("/cellblock.v1.CodeModeService/Exec", request_serializer=lambda b: b, response_deserializer=lambda b: b)
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            async for _ in call(requests()):
                await queue.put(bad)  # the ToolCall arrived
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT, raised.value
    # The leg ends at once (its deadline is 10 s away) and leaves no run behind: none parked, none running.
    for _ in range(50):
        runs = (await client.list_runs(scope)).runs
        if not runs and service.state.admission.running == 0:
            break
        await asyncio.sleep(0.1)
    assert runs == [], runs
    assert service.state.admission.running == 0
    assert asyncio.get_running_loop().time() - started < 7  # the leg's deadline is 8 s (conftest)
