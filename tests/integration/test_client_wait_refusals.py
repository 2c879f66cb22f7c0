"""A wait the service refuses changes nothing for the run (SPEC §5.2), in the Python client too.

Found by a fresh user's review: the client cancelled every handler of the run on any
result that was not ``waiting``, so a second concurrent wait ([W06]) or a wait from
another session on the same client ([W04]) killed the run's in-flight tool call, and
every later wait answered ``waiting`` until the run expired. Real service, real cells.
"""

from __future__ import annotations

import asyncio

import pytest

from cellblock.client import CellblockClient, Scope
from tests.integration.test_suspend_resume import SHORT, Gate, _catalog

pytestmark = pytest.mark.asyncio(loop_scope="session")

CODE = 'const r = await tools.callValue("client:app:slow", {q: 1}); return r.answer + "!";'


async def _parked_on_the_gate(client: CellblockClient, scope: Scope, gate: Gate, tool_call_id: str) -> str:
    await _catalog(client, scope)
    first = await client.exec(scope, tool_call_id=tool_call_id, code=CODE, handlers={"slow": gate}, limits=SHORT)
    assert (first.status, first.reason) == ("waiting", "pending_tools"), first.raw_json
    assert first.run_id
    return first.run_id


async def test_a_wait_from_another_session_on_the_same_client_keeps_the_owners_tool_call(client: CellblockClient, scope: Scope) -> None:
    gate = Gate()
    run_id = await _parked_on_the_gate(client, scope, gate, "r1")
    other = Scope(session_id=scope.session_id + "-other", agent_run_id=scope.agent_run_id)
    refused = await client.wait(other, tool_call_id="r1-x", run_id=run_id)
    assert (refused.status, refused.code, refused.failure_phase) == ("failed", "invalid_input", "input"), refused.raw_json
    gate.open(0)  # the handler answers while no wait is open: its result waits in the client for the owner's wait
    done = await client.wait(scope, tool_call_id="r1-w", run_id=run_id, handlers={"slow": gate})
    assert (done.status, done.value) == ("completed", "late-1!"), done.raw_json


async def test_a_refused_second_wait_keeps_the_runs_tool_call(client: CellblockClient, scope: Scope) -> None:
    gate = Gate()
    run_id = await _parked_on_the_gate(client, scope, gate, "r2")
    a, b = await asyncio.gather(
        client.wait(scope, tool_call_id="r2-a", run_id=run_id, handlers={"slow": gate}),
        client.wait(scope, tool_call_id="r2-b", run_id=run_id, handlers={"slow": gate}),
    )
    refused = [r for r in (a, b) if r.status == "failed"]
    assert [r.error for r in refused] == ["this run is already being resumed by another wait; let that call return first."], (a.raw_json, b.raw_json)
    assert [r.status for r in (a, b) if r.status != "failed"] == ["waiting"], (a.raw_json, b.raw_json)
    gate.open(0)
    done = await client.wait(scope, tool_call_id="r2-w", run_id=run_id, handlers={"slow": gate})
    assert (done.status, done.value) == ("completed", "late-1!"), done.raw_json
    assert gate.calls == [{"q": 1}]
