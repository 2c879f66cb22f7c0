"""Exec end to end: real gRPC, real Docker cells, real QuickJS (issue #2)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from cellblock.client import CellblockClient, Scope, Tool
from tests.support.cells import cells_asked_for

pytestmark = pytest.mark.asyncio(loop_scope="session")

SHIPMENTS = [
    {"id": "S-1", "paid": False, "tons": 12.5},
    {"id": "S-2", "paid": True, "tons": 40},
    {"id": "S-3", "paid": False, "tons": 3},
    {"id": "S-4", "paid": False, "tons": 22},
]

TOOLS = [
    Tool(
        source="host",
        owner="shipping",
        name="shipping_list",
        description="List shipments with payment state and weight.",
        parameters={"type": "object", "properties": {}, "additionalProperties": False},
        output_schema={
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"id": {"type": "string"}, "paid": {"type": "boolean"}, "tons": {"type": "number"}},
                "required": ["id", "paid", "tons"],
                "additionalProperties": False,
            },
        },
    ),
    Tool(
        source="host",
        owner="core",
        name="echo",
        description="Echo the input back.",
        parameters={"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"], "additionalProperties": False},
    ),
]


async def _register(client: CellblockClient, scope: Scope) -> None:
    await client.put_catalog(scope, TOOLS)


async def test_value_output_and_nested_call_round_trip(client: CellblockClient, scope: Scope) -> None:
    await _register(client, scope)
    seen: list[dict[str, Any]] = []
    streamed: list[dict[str, Any]] = []

    async def shipping_list(tool_input: dict[str, Any], call: Any) -> dict[str, Any]:
        seen.append(tool_input)
        assert call.catalog_id == "host:shipping:shipping_list"
        assert call.parent_tool_call_id == "model-call-1"
        return {"content": [{"type": "text", "text": "4 shipments"}], "details": SHIPMENTS}

    code = (
        'const hit = (await tools.search("shipping list"))[0];\n'
        "const rows = await tools.callValue(hit.id, {});\n"
        'console.log("rows", rows.length); text("done"); json({k: 1});\n'
        "return rows.filter(r => !r.paid && r.tons > 10).map(r => r.id);"
    )
    result = await client.exec(scope, tool_call_id="model-call-1", code=code, handlers={"host:shipping:shipping_list": shipping_list}, on_output=streamed.append)
    assert result.status == "completed", result.raw_json
    assert result.value == ["S-1", "S-4"]
    assert seen == [{}]
    model_output = json.loads(result.raw_json)["output"]
    assert model_output == [{"type": "text", "text": "rows 4"}, {"type": "text", "text": "done"}, {"type": "json", "value": {"k": 1}}]
    assert streamed == result.output, "streamed output events must mirror the result's entries"
    assert result.telemetry.search_count == 1 and result.telemetry.call_count == 1


async def test_parallel_nested_calls_reach_handler_with_their_inputs(client: CellblockClient, scope: Scope) -> None:
    await _register(client, scope)
    running = 0
    peak = 0
    inputs: list[dict[str, Any]] = []

    async def echo(tool_input: dict[str, Any], call: Any) -> dict[str, Any]:
        nonlocal running, peak
        inputs.append(tool_input)
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.2)
        running -= 1
        return {"details": {"n": tool_input["n"] * 10}}

    code = "const r = await Promise.all([1,2,3,4,5].map(n => tools.echo({n}))); return r.map(x => x.n);"
    result = await client.exec(scope, tool_call_id="c2", code=code, handlers={"echo": echo})
    assert result.status == "completed", result.raw_json
    assert result.value == [10, 20, 30, 40, 50]
    assert sorted(i["n"] for i in inputs) == [1, 2, 3, 4, 5] and all(set(i) == {"n"} for i in inputs)
    assert peak == 5, "the five calls were not in flight together"


async def test_unknown_tool_fails_with_spec_message(client: CellblockClient, scope: Scope) -> None:
    await _register(client, scope)
    result = await client.exec(scope, tool_call_id="c3", code='return await tools.callValue("host:nope:missing", {});', handlers={})
    assert result.status == "failed"
    assert result.code == "internal_error"
    assert result.failure_phase == "bridge"
    assert result.error.startswith("Error: Unknown tool: host:nope:missing.")
    assert "Find tools with tools.search, inspect one with tools.describe, then call it with its exact id or name." in result.error


async def test_input_contract_rejection_is_invalid_input(client: CellblockClient, scope: Scope) -> None:
    await _register(client, scope)
    result = await client.exec(scope, tool_call_id="c4", code='return await tools.callValue("host:core:echo", {m: 1});', handlers={})
    assert result.status == "failed"
    assert result.code == "invalid_input"
    assert result.failure_phase == "bridge"
    assert 'Tool "host:core:echo" input does not match its parameters' in result.error
    assert result.bridge_dispatch_started is False


async def test_guest_error_is_internal_error_with_guest_phase(client: CellblockClient, scope: Scope) -> None:
    await _register(client, scope)
    result = await client.exec(scope, tool_call_id="c5", code='const e = new Error("boom"); e.code = "timeout"; throw e;', handlers={})
    assert result.status == "failed"
    assert result.code == "internal_error", "a guest-set error.code must never change the code"
    assert result.failure_phase == "guest"
    assert result.error.startswith("Error: boom")


async def test_busy_loop_times_out_and_next_exec_works(client: CellblockClient, scope: Scope) -> None:
    await _register(client, scope)
    from cellblock.client import LimitOverrides

    started = time.monotonic()
    result = await client.exec(scope, tool_call_id="c6", code="while(true){}", handlers={}, limits=LimitOverrides(timeout_ms=1500))
    elapsed = time.monotonic() - started
    assert result.status == "failed"
    assert result.code == "timeout"
    assert result.error == "timeout exceeded: the program was still running when its 1500 ms budget ran out."
    # timeoutMs starts when the cell has the program (SPEC §10.2 item 3); getting the cell is bounded apart.
    assert elapsed < 1.5 + 3.0 + 10.0, f"took {elapsed:.1f}s"  # timeoutMs + 3 s + the cell wait bound
    again = await client.exec(scope, tool_call_id="c7", code="return 6 * 7", handlers={})
    assert again.status == "completed" and again.value == 42


async def test_invalid_input_starts_no_cell(client: CellblockClient, scope: Scope, service: Any) -> None:
    await _register(client, scope)
    before = cells_asked_for(service)
    result = await client.exec(scope, tool_call_id="c8", arguments={"code": "ls -la /tmp"}, handlers={})
    assert result.status == "failed" and result.code == "invalid_input" and result.failure_phase == "input"
    assert result.error.startswith("exec runs JavaScript or TypeScript, not shell commands")
    result = await client.exec(scope, tool_call_id="c9", arguments={"command": "return 1", "code": "return 2"}, handlers={})
    assert result.error == "code and command must be identical when both are given; send the program in code."
    assert cells_asked_for(service) == before


async def test_output_budget_truncates_and_keeps_status(client: CellblockClient, scope: Scope) -> None:
    await _register(client, scope)
    from cellblock.client import LimitOverrides

    code = 'for (let i = 0; i < 200; i++) console.log("x".repeat(100)); return "ok";'
    result = await client.exec(scope, tool_call_id="c10", code=code, handlers={}, limits=LimitOverrides(max_output_bytes=4096))
    assert result.status == "completed" and result.value == "ok"
    output = json.loads(result.raw_json)["output"]
    marker = output[-1]
    assert marker["type"] == "truncated" and marker["truncated"] is True and marker["omittedEntries"] > 0
    total = sum(len(json.dumps(e, separators=(",", ":"), ensure_ascii=False).encode()) for e in output)
    assert total <= 4096
