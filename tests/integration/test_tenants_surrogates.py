"""Lone UTF-16 surrogates in JSON text never reach the service's internals (issue 11 class 2, SPEC §0.3 item 7).

Real service, real cells. JSON text may spell a lone surrogate (``"\\ud800"``); Python's decoder
yields a str that cannot be encoded as UTF-8, so it must never reach a proto string, the run
store or a log line. Program text and run ids holding one are refused as ``invalid_input``
([E11], [W09]); ids a guest passes are refused with their text escaped ([B28]); data values
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
    "call",
    ['tools.describe("\\ud800")', 'tools.callValue("host:core:\\ud800", {})', 'tools.call("host:core:x\\udc00y", {})'],
)
async def test_a_guest_id_with_a_lone_surrogate_is_refused_to_the_guest(client: CellblockClient, scope: Scope, call: str) -> None:
    await client.put_catalog(scope, [Tool(source="host", owner="core", name="lone")])
    code = f"try {{ await {call}; return 'no error'; }} catch (e) {{ return [e.code, e.message]; }}"
    result = await client.exec(scope, tool_call_id="sg-id", code=code, handlers={"host:core:lone": lone})
    assert result.status == "completed", result.raw_json
    code_, message = result.value
    assert code_ not in INTERNAL, result.raw_json
    assert "\\ud" in message or "\\udc00" in message, message


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
