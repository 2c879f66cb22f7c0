r"""Lone UTF-16 surrogates in JSON text never reach the service's internals (issue 11 class 2, SPEC §0.3 item 7).

Real service, real cells. JSON text may spell a lone surrogate (``"\ud800"``); Python's decoder
yields a str that cannot be encoded as UTF-8, so it must never reach a proto string, the run
store or a log line. Program text and run ids holding one are refused as ``invalid_input``
([E11], [W09]); ids a guest passes get their usual refusal with the id escaped; data values
pass through.
"""

from __future__ import annotations

from typing import Any

import pytest

from cellblock.client import CellblockClient, Scope, Tool
from cellblock.server import messages as msg

pytestmark = pytest.mark.asyncio(loop_scope="session")

INTERNAL = ("internal_error", "unknown")


async def lone(tool_input: Any, call: Any) -> Any:
    return {"s": "\ud800", "n": tool_input.get("n", 0)}


async def test_program_text_with_a_lone_surrogate_is_refused_as_input(client: CellblockClient, scope: Scope) -> None:
    await client.put_catalog(scope, [Tool(source="host", owner="core", name="lone")])
    result = await client.exec(scope, tool_call_id="sg-exec", arguments='{"code":"return \\"\\ud800\\""}', handlers={})
    assert (result.status, result.code, result.failure_phase) == ("failed", "invalid_input", "input"), result.raw_json
    assert result.error == msg.E11


async def test_a_run_id_with_a_lone_surrogate_is_refused_as_input(client: CellblockClient, scope: Scope) -> None:
    await client.put_catalog(scope, [Tool(source="host", owner="core", name="lone")])
    result = await client.wait(scope, tool_call_id="sg-wait", arguments='{"runId":"run_\\ud800"}')
    assert (result.status, result.code, result.failure_phase) == ("failed", "invalid_input", "input"), result.raw_json
    assert result.error == msg.W09


@pytest.mark.parametrize(
    ("call", "shown"),
    [
        ('tools.describe("\\ud800")', "\\ud800"),
        ('tools.callValue("host:core:\\ud800", {})', "host:core:\\ud800"),
        ('tools.call("host:core:x\\udc00y", {})', "host:core:x\\udc00y"),
    ],
)
async def test_a_guest_id_with_a_lone_surrogate_is_refused_to_the_guest(client: CellblockClient, scope: Scope, call: str, shown: str) -> None:
    await client.put_catalog(scope, [Tool(source="host", owner="core", name="lone")])
    code = f"try {{ await {call}; return 'no error'; }} catch (e) {{ return [e.code, e.message]; }}"
    result = await client.exec(scope, tool_call_id="sg-id", code=code, handlers={"host:core:lone": lone})
    assert result.status == "completed", result.raw_json
    code_, message = result.value
    assert code_ not in INTERNAL, result.raw_json
    assert message.startswith(f"Unknown tool: {shown}."), result.raw_json  # [B07], the id escaped


async def test_a_tool_result_with_a_lone_surrogate_passes_through(client: CellblockClient, scope: Scope) -> None:
    await client.put_catalog(scope, [Tool(source="host", owner="core", name="lone")])
    code = 'const r = await tools.callValue("host:core:lone", {n: 1}); text(r.s); return [r.s.length, r.s.charCodeAt(0), r.n];'
    result = await client.exec(scope, tool_call_id="sg-result", code=code, handlers={"host:core:lone": lone})
    assert (result.status, result.code) == ("completed", None), result.raw_json
    assert result.value == [1, 0xD800, 1]


async def test_a_final_value_and_output_with_a_lone_surrogate_complete(client: CellblockClient, scope: Scope) -> None:
    await client.put_catalog(scope, [Tool(source="host", owner="core", name="lone")])
    code = 'text("a\\ud800b"); json({k: "\\udfff"}); return "\\ud800";'
    result = await client.exec(scope, tool_call_id="sg-final", code=code, handlers={})
    assert (result.status, result.code) == ("completed", None), result.raw_json
    assert result.value == "\ud800"


async def echo_length(tool_input: Any, call: Any) -> Any:
    return {"len": len(tool_input["s"]), "first": ord(tool_input["s"][0])}


async def test_a_tool_input_and_a_search_query_with_a_lone_surrogate_pass_through(client: CellblockClient, scope: Scope) -> None:
    await client.put_catalog(scope, [Tool(source="host", owner="core", name="echo_length")])
    code = 'const found = await tools.search("\\ud800 echo"); const r = await tools.callValue("host:core:echo_length", {s: "\\udc00x"}); return [found.length > 0, r];'
    result = await client.exec(scope, tool_call_id="sg-input", code=code, handlers={"host:core:echo_length": echo_length})
    assert (result.status, result.code) == ("completed", None), result.raw_json
    assert result.value == [True, {"len": 2, "first": 0xDC00}]


async def test_a_schema_with_a_lone_surrogate_registers_and_runs(client: CellblockClient, scope: Scope) -> None:
    # Registration JSON is the client's: a lone surrogate in a schema's description reaches the
    # guest's declarations (the Start message) and describe's reply.
    schema = {"type": "object", "properties": {"s": {"type": "string", "description": "a\ud800b"}}}
    await client.put_catalog(scope, [Tool(source="host", owner="core", name="echo_length", parameters=schema)])
    code = 'const d = await tools.describe("host:core:echo_length"); return d.parameters.properties.s.description === "a\\ud800b";'
    result = await client.exec(scope, tool_call_id="sg-schema", code=code, handlers={"host:core:echo_length": echo_length})
    assert result.code not in INTERNAL, result.raw_json
    assert (result.status, result.value) == ("completed", True), result.raw_json


async def test_a_thrown_error_with_a_lone_surrogate_is_the_guests_failure(client: CellblockClient, scope: Scope) -> None:
    await client.put_catalog(scope, [Tool(source="host", owner="core", name="lone")])
    result = await client.exec(scope, tool_call_id="sg-throw", code='throw new Error("bad \\ud800 text");', handlers={})
    assert (result.status, result.failure_phase) == ("failed", "guest"), result.raw_json
    assert "bad" in result.error, result.raw_json


async def test_a_suspended_run_keeps_a_lone_surrogate_through_the_run_store(client: CellblockClient, scope: Scope) -> None:
    # The yield reason, a pending call's input and the output are stored while the run waits (SPEC §10.7).
    await client.put_catalog(scope, [Tool(source="host", owner="core", name="echo_length")])
    code = 'text("a\\udc00"); const p = tools.callValue("host:core:echo_length", {s: "\\ud800"}); const y = await yield_control("why \\ud800"); return [y, await p];'
    first = await client.exec(scope, tool_call_id="sg-yield", code=code, handlers={"host:core:echo_length": echo_length})
    assert first.status == "waiting", first.raw_json
    done = await client.wait(scope, tool_call_id="sg-yield-w", run_id=first.run_id, handlers={"host:core:echo_length": echo_length})
    assert (done.status, done.code) == ("completed", None), done.raw_json
    assert done.value == [{"status": "yielded", "reason": "why \ud800"}, {"len": 1, "first": 0xD800}]
