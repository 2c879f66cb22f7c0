"""Nesting depth and malformed protos get a bounded, documented outcome (issue 11 item 2).

Every JSON path (the final value, tool inputs, tool results, output entries, schemas)
is driven to depth 100,000 in a real cell against the real service; each ends with a
specific result or status, never gRPC ``UNKNOWN`` with a Python class name and never a
run left ``RUNNING``.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import grpc
import pytest

from cellblock.client import CellblockClient, Scope, Tool
from cellblock.server import messages
from cellblock.server.limits import MAX_VALUE_DEPTH
from cellblock.v1 import code_mode_service_pb2 as cpb
from cellblock.v1 import common_pb2
from tests.support.cells import ended_without_a_run

pytestmark = pytest.mark.asyncio(loop_scope="session")

# The cell's controller serialises no value nested deeper than MAX_VALUE_DEPTH (256) levels of arrays
# and objects (SPEC §8.8 rule 7): its engine's JSON.stringify has no stack check and trapped at about
# 12,000 levels ([R10] for 100,000 before). Each path is driven to the limit, one past it, and 100,000;
# at the limit the host reads and keeps the value on every path.
LIMIT = MAX_VALUE_DEPTH
DEPTHS = [LIMIT + 1, 3000, 100_000]
NEST = "let v = 0; for (let i = 0; i < %d; i++) v = [v]; "
DEEP = f"nested deeper than {LIMIT} levels"


async def _exec(client: CellblockClient, scope: Scope, code: str, handlers: dict[str, Any] | None = None) -> Any:
    await client.put_catalog(scope, [Tool(source="host", owner="core", name="echo"), Tool(source="client", owner="app", name="deep")])
    return await asyncio.wait_for(client.exec(scope, tool_call_id="deep", code=code, handlers=handlers or {}), timeout=60)


async def _no_run_left(client: CellblockClient, scope: Scope) -> None:
    runs = await client.list_runs(scope)
    assert [r for r in runs.runs if r.state == "running"] == [], runs


@pytest.mark.parametrize("depth", DEPTHS)
async def test_a_deep_final_value_fails_with_r15_naming_the_limit(client: CellblockClient, scope: Scope, depth: int) -> None:
    result = await _exec(client, scope, NEST % depth + "return v;")
    assert (result.status, result.code) == ("failed", "output_limit_exceeded"), result.raw_json
    assert result.error == f"output limit exceeded: the return value could not be serialised into a bounded result (nesting is deeper than {LIMIT} levels).", result.raw_json
    await _no_run_left(client, scope)


@pytest.mark.parametrize("shape", ["toJSON", "getter", "proxy"])
async def test_depth_is_counted_as_serialised(client: CellblockClient, scope: Scope, shape: str) -> None:
    # toJSON results, getters and Proxies are counted as JSON.stringify meets them, not as the value looks.
    build = {
        "toJSON": "v = {a: v, toJSON() { return {b: this.a}; }};",
        "getter": "{ const w = v; v = {get a() { return w; }}; }",
        "proxy": "v = new Proxy([v], {});",
    }[shape]
    result = await _exec(client, scope, "let v = 0; for (let i = 0; i < 100000; i++) " + build + " return v;")
    assert result.code == "output_limit_exceeded", result.raw_json
    assert result.error.endswith(f"(nesting is deeper than {LIMIT} levels)."), result.raw_json


@pytest.mark.parametrize("leaf", ["0", "1e-7"])
async def test_a_value_at_the_limit_round_trips(client: CellblockClient, scope: Scope, leaf: str) -> None:
    # 1e-7: a float json.dumps spells differently from JavaScript, written by the host's slowest path.
    result = await _exec(client, scope, (NEST % LIMIT).replace("v = 0", f"v = {leaf}") + "return v;")
    assert result.status == "completed", result.raw_json
    value, seen = result.value, 0
    while isinstance(value, list):
        value, seen = value[0], seen + 1
    assert (seen, value) == (LIMIT, float(leaf))


@pytest.mark.parametrize("depth", [LIMIT - 1, *DEPTHS])
async def test_a_deep_tool_input_is_refused_to_the_guest(client: CellblockClient, scope: Scope, depth: int) -> None:
    calls: list[Any] = []

    async def echo(tool_input: Any, call: Any) -> Any:
        calls.append(tool_input)
        return {"details": "ok"}

    # The argument {v} nests one level more than v: LIMIT - 1 is exactly the limit.
    code = NEST % depth + 'try { await tools.callValue("host:core:echo", {v}); return "called"; } catch (e) { return "refused: " + e.message; }'
    result = await _exec(client, scope, code, {"echo": echo})
    assert result.status == "completed", result.raw_json
    if depth == LIMIT - 1:
        # At the limit the guest sends it and the host calls the tool with it.
        assert (result.value, len(calls)) == ("called", 1), result.raw_json
    else:
        assert calls == []
        assert result.value == f"refused: this callValue request is nested too deeply for the bridge (at most {LIMIT} levels of arrays and objects); send flatter data.", result.value
    await _no_run_left(client, scope)


#: A tree-shaped host schema (file trees, ASTs): ``x`` is a node whose ``next`` is a node, to any depth.
_NODE = {"type": "object", "properties": {"next": {"$ref": "#/$defs/n"}}}
TREE = {"type": "object", "$defs": {"n": _NODE}, "properties": {"x": {"$ref": "#/$defs/n"}}}


async def test_a_recursive_schema_checks_inputs_and_results_near_the_nesting_bound(client: CellblockClient, scope: Scope) -> None:
    # Before, checking a 180-level tree against TREE ran out of Python's recursion limit inside a Rust
    # extension: its PanicException (a BaseException) escaped every handler, the Exec stream never
    # answered (the client waited out its own deadline) and the run stayed RUNNING for good.
    seen: list[Any] = []

    async def tree(tool_input: Any, call: Any) -> Any:
        seen.append(tool_input)
        return {"details": tool_input["x"]}

    tools = [Tool(source="host", owner="o", name="tree", parameters=TREE, output_schema={"$defs": {"n": _NODE}, "$ref": "#/$defs/n"})]
    await client.put_catalog(scope, tools)
    depth = LIMIT - 6  # the argument {x: v} with v's {} leaf: within the bridge's bound
    build = f"let v = {{}}; for (let i = 0; i < {depth}; i++) v = {{next: v}}; "
    count = "let d = 0; for (let n = r; n && n.next; n = n.next) d++; return d;"
    valid = build + 'try { const r = await tools.callValue("host:o:tree", {x: v}); ' + count + ' } catch (e) { return "refused: " + e.message; }'
    result = await asyncio.wait_for(client.exec(scope, tool_call_id="tree", code=valid, handlers={"tree": tree}), timeout=60)
    assert (result.status, result.value, len(seen)) == ("completed", depth, 1), result.raw_json
    # The same tree with a number at its leaf is refused to the guest with [B10] and its JSON pointer.
    invalid = build.replace("let v = {}", "let v = {next: 5}") + 'try { await tools.callValue("host:o:tree", {x: v}); return "called"; } catch (e) { return "refused: " + e.message; }'
    result = await asyncio.wait_for(client.exec(scope, tool_call_id="tree-bad", code=invalid, handlers={"tree": tree}), timeout=60)
    assert result.status == "completed" and len(seen) == 1, result.raw_json
    assert result.value.startswith('refused: Tool "host:o:tree" input does not match its parameters: /x/next/next/'), result.value
    assert "could not be evaluated" not in result.value, result.value
    await _no_run_left(client, scope)


async def test_an_uncaught_deep_tool_input_is_invalid_input(client: CellblockClient, scope: Scope) -> None:
    # The controller's refusal is recorded by the host with input provenance, like its own [B23].
    result = await _exec(client, scope, NEST % 100_000 + 'await tools.callValue("host:core:echo", {v}); return 1;')
    assert (result.status, result.code) == ("failed", "invalid_input"), result.raw_json
    assert result.error.startswith("Error: this callValue request is nested too deeply for the bridge"), result.raw_json


async def _raw_result_exec(service: Any, scope: Scope, code: str, ok_json: str) -> dict[str, Any]:
    """Runs ``code`` over a raw Exec stream, answering its one ToolCall with ``ok_json`` verbatim; returns the Result's JSON.

    A runtime in any language can send text no Python handler can produce, such as JSON nested 100,000 deep.
    """
    start = cpb.ExecRequest(start=cpb.ExecStart(scope=common_pb2.Scope(session_id=scope.session_id, agent_run_id=scope.agent_run_id), tool_call_id="raw", arguments_json=json.dumps({"code": code})))
    queue: asyncio.Queue[cpb.ExecRequest] = asyncio.Queue()
    await queue.put(start)

    async def requests() -> Any:
        while True:
            yield await queue.get()

    async with grpc.aio.insecure_channel(service.address, options=[("grpc.max_send_message_length", 64 << 20)]) as channel:
        call = channel.stream_stream("/cellblock.v1.CodeModeService/Exec", request_serializer=cpb.ExecRequest.SerializeToString, response_deserializer=cpb.ExecResponse.FromString)
        stream = call(requests())
        async for response in stream:
            if response.HasField("tool_call"):
                await queue.put(cpb.ExecRequest(tool_result=cpb.ToolResult(nested_call_id=response.tool_call.nested_call_id, ok_json=ok_json)))
            elif response.HasField("result"):
                stream.cancel()
                return dict(json.loads(response.result.result_json))
    raise AssertionError("the Exec stream ended without a Result")


# A result at the bound (its details at LIMIT) is delivered; one level more is refused with [B29] on every
# path: read on the loop (up to 64 KiB) and in a worker (beyond), at any depth. Before, a result past the
# parser's recursion limit was "not valid JSON" and one between 257 and about 950 levels was delivered.
@pytest.mark.parametrize(("depth", "pad"), [(LIMIT, 0), (LIMIT, 70_000), (LIMIT + 1, 0), (LIMIT + 1, 70_000), (3000, 0), (20_000, 0), (100_000, 0)])
async def test_a_deep_tool_result_is_refused_to_the_guest_with_b29(service: Any, client: CellblockClient, scope: Scope, depth: int, pad: int) -> None:
    await client.put_catalog(scope, [Tool(source="client", owner="app", name="deep")])
    details = "[" * depth + "0" + "]" * depth
    ok_json = '{"pad":"' + "x" * pad + '","details":' + details + "}"
    code = 'try { const r = await tools.callValue("client:app:deep", {}); let d = 0; for (let v = r; Array.isArray(v); v = v[0]) d++; return d; } catch (e) { return "refused: " + e.message; }'
    result = await asyncio.wait_for(_raw_result_exec(service, scope, code, ok_json), timeout=60)
    assert result["status"] == "completed", result
    if depth <= LIMIT:
        assert result["value"] == depth, result
    else:
        assert result["value"] == "refused: " + messages.b29("client:app:deep"), result
    await _no_run_left(client, scope)


@pytest.mark.parametrize("depth", DEPTHS)
async def test_deep_output_and_yield_values_are_guest_errors(client: CellblockClient, scope: Scope, depth: int) -> None:
    code = NEST % depth + """
      const got = [];
      for (const [name, f] of [["json", json], ["text", text], ["yield_control", yield_control]]) {
        try { await f(v); got.push(name + ": sent"); } catch (e) { got.push(e.constructor.name + ": " + e.message); }
      }
      console.log("log:", v);
      return got;"""
    result = await _exec(client, scope, code)
    assert result.status == "completed", result.raw_json
    assert result.value == [f"TypeError: {name} could not turn its argument into JSON: it is {DEEP}; send flatter data." for name in ("json", "text", "yield_control")]
    assert [e.text for e in result.output] == [f"log: [{DEEP}]"], result.output
    await _no_run_left(client, scope)


async def test_output_at_the_limit_is_written(client: CellblockClient, scope: Scope) -> None:
    result = await _exec(client, scope, NEST % LIMIT + "json(v); text(v); console.log(v); await yield_control(v); return 1;")
    assert result.status == "waiting", result.raw_json
    assert [e.type for e in result.output] == ["json", "text", "text"], result.output
    assert [len(e.text or "") for e in result.output] == [0, 2 * LIMIT + 1, 2 * LIMIT + 1]


async def test_a_deep_thrown_value_is_a_guest_error(client: CellblockClient, scope: Scope) -> None:
    result = await _exec(client, scope, NEST % 100_000 + "throw v;")
    assert (result.status, result.error) == ("failed", f"Uncaught [value {DEEP}]"), result.raw_json


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
    await ended_without_a_run(service, client, scope)
    assert asyncio.get_running_loop().time() - started < 7  # the leg's deadline is 8 s (conftest)
