"""The leg's settle loop and the runner's wait flow, with real QuickJS cells and no Docker.

Every test goes through the real service over a real socket: the Python client, the Exec/Wait
streams, the runner, the leg and its settle loop, the bridge and the guest agent's QuickJS VM
(the ``process`` executor). Each one pins a transition of SPEC §10.3-§10.9: completion,
auto-drain, park on deadline, resume from the cell-free part of a wait, timers, held-call
dispatch, abort, and the claim rules of a wait.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import grpc
import pytest

from cellblock.client import CellblockClient, LimitOverrides, Scope, Tool, ToolCallInfo
from cellblock.server import messages as msg
from cellblock.server.app import Service
from cellblock.server.runs import Leg
from cellblock.v1 import code_mode_service_pb2 as cpb
from cellblock.v1 import code_mode_service_pb2_grpc as cpb_grpc
from cellblock.v1 import common_pb2

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(60)]

TOOLS = [
    Tool(source="client", owner="app", name="echo", description="Returns its input."),
    Tool(source="client", owner="app", name="slow", description="Answers when the test says so."),
    Tool(
        source="host",
        owner="core",
        name="lookup",
        description="A replay-safe read.",
        parameters={"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"], "additionalProperties": False},
        replay_safe=True,
    ),
]
#: For the tests whose point is the deadline: generous for a local subprocess cell (about 0.4 s
#: to start on an idle machine; cell start counts against the deadline), short enough to park
#: soon. The other tests park at once (a yield, or a restart-safe leg going idle) and keep the
#: default 10 s deadline, so a loaded machine cannot make them time out.
SHORT = LimitOverrides(timeout_ms=3000)
#: A host tool whose calls a restart-safe run holds until its next wait (SPEC §10.8).
LOOKUP = 'return await tools.callValue("host:core:lookup", {key: "k"});'


async def _parked_restart_safe(client: CellblockClient, scope: Scope, tool_call_id: str, code: str = LOOKUP) -> str:
    """Starts a restart-safe run that parks as soon as its guest waits, with its call held."""
    first = await client.exec(scope, tool_call_id=tool_call_id, code=code, handlers={}, force_restart_safe=True)
    assert (first.status, first.replay_safe) == ("waiting", True), first.raw_json
    assert first.run_id
    return first.run_id

_counter = iter(range(1, 1_000_000))


@pytest.fixture
def scope() -> Scope:
    n = next(_counter)
    return Scope(session_id=f"proc-sess-{n}", agent_run_id=f"proc-agent-{n}")


class Gate:
    """A handler whose calls finish only when the test opens them, in call order."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.infos: list[ToolCallInfo] = []
        self._gates: list[asyncio.Event] = []
        self.called = asyncio.Event()

    def _gate(self, index: int) -> asyncio.Event:
        while len(self._gates) <= index:
            self._gates.append(asyncio.Event())
        return self._gates[index]

    async def __call__(self, tool_input: dict[str, Any], call: ToolCallInfo) -> dict[str, Any]:
        index = len(self.calls)
        self.calls.append(tool_input)
        self.infos.append(call)
        self.called.set()
        await self._gate(index).wait()
        return {"details": {"answer": f"late-{index + 1}"}}

    def open(self, index: int) -> None:
        self._gate(index).set()


async def echo(tool_input: dict[str, Any], call: ToolCallInfo) -> dict[str, Any]:
    await asyncio.sleep(0.02)
    return {"details": tool_input}


async def _catalog(client: CellblockClient, scope: Scope) -> None:
    await client.put_catalog(scope, TOOLS)


# ------------------------------------------------------------------ completion and auto-drain
async def test_completion_in_one_leg(client: CellblockClient, scope: Scope) -> None:
    await _catalog(client, scope)
    result = await client.exec(scope, tool_call_id="c1", code='console.log("hi"); return 1 + 1;', handlers={})
    assert (result.status, result.value) == ("completed", 2), result.raw_json
    assert [e.text for e in result.output] == ["hi"]
    assert result.metadata.leg_count == 1 and result.metadata.bridge_calls.call == 0


async def test_auto_drain_delivers_results_and_detached_calls_in_the_same_leg(client: CellblockClient, scope: Scope) -> None:
    """Auto-drain: in-time results are delivered within the leg (SPEC §10.4).

    SPEC §10.4: results that arrive in time are delivered and the VM runs on without parking;
    a detached call is host work, so the run completes only after it settled (§10.3 item 3).
    """
    await _catalog(client, scope)
    seen: list[dict[str, Any]] = []

    async def recording_echo(tool_input: dict[str, Any], call: ToolCallInfo) -> dict[str, Any]:
        await asyncio.sleep(0.05)
        seen.append(tool_input)
        return {"details": tool_input}

    code = """
void tools.callValue("client:app:echo", {detached: true});
const got = [];
for (let i = 1; i <= 3; i++) got.push((await tools.callValue("client:app:echo", {i})).i);
return got;
"""
    result = await client.exec(scope, tool_call_id="c2", code=code, handlers={"echo": recording_echo})
    assert (result.status, result.value) == ("completed", [1, 2, 3]), result.raw_json
    assert result.metadata.leg_count == 1, "every result arrived in time: no park"
    assert result.metadata.bridge_calls.call == 4
    assert {"detached": True} in seen and len(seen) == 4, "the detached call settled before the run completed"


# ------------------------------------------------------------------ park, wait, resume
async def test_park_on_deadline_then_the_cell_free_wait_resumes_with_the_result(client: CellblockClient, scope: Scope) -> None:
    """Park on deadline: a pending call parks the leg (SPEC §10.4 item 6).

    A pending call is host work: at the deadline the leg parks instead of timing out (SPEC
    §10.4 item 6); the wait resumes once the call's result arrives.
    """
    await _catalog(client, scope)
    gate = Gate()
    code = 'const r = await tools.callValue("client:app:slow", {q: 1}); return r.answer + "!";'
    first = await client.exec(scope, tool_call_id="p1", code=code, handlers={"slow": gate}, limits=SHORT)
    assert (first.status, first.reason) == ("waiting", "pending_tools"), first.raw_json
    assert [(p.id, p.method) for p in first.pending_tool_calls] == [("bridge:callValue:1", "callValue")]
    run = await client.get_run(scope, first.run_id)
    assert run.state == "suspended" and run.snapshot_bytes > 0

    async def open_later() -> None:
        await asyncio.sleep(0.3)
        gate.open(0)

    opener = asyncio.ensure_future(open_later())
    done = await client.wait(scope, tool_call_id="p1-w", run_id=first.run_id, handlers={"slow": gate})
    await opener
    assert (done.status, done.value) == ("completed", "late-1!"), done.raw_json
    assert gate.calls == [{"q": 1}], "the in-flight call was not dispatched again"
    assert done.metadata.leg_count == 2


async def test_a_wait_with_nothing_to_deliver_returns_waiting_again_without_a_cell(client: CellblockClient, scope: Scope) -> None:
    """A wait with nothing by its deadline returns waiting again (SPEC §10.6 item 5).

    SPEC §10.6 item 5: the wait dispatches the held call, nothing arrives before its deadline,
    so it returns ``waiting`` again for the same run without starting a cell.
    """
    await _catalog(client, scope)
    gate = Gate()
    first = await client.exec(scope, tool_call_id="p2", code=LOOKUP, handlers={}, force_restart_safe=True, limits=SHORT)
    assert first.status == "waiting", first.raw_json
    again = await client.wait(scope, tool_call_id="p2-w1", run_id=first.run_id, handlers={"lookup": gate})
    assert (again.status, again.run_id) == ("waiting", first.run_id), again.raw_json
    assert [(p.id, p.method) for p in again.pending_tool_calls] == [("bridge:callValue:1", "callValue")]
    assert again.metadata.cell_id == "", "no cell was started"
    assert len(gate.calls) == 1, "the held call was dispatched once"
    gate.open(0)
    done = await client.wait(scope, tool_call_id="p2-w2", run_id=first.run_id, handlers={"lookup": gate})
    assert (done.status, done.value) == ("completed", {"answer": "late-1"}), done.raw_json
    assert len(gate.calls) == 1, "an in-flight call is not dispatched again"


# ------------------------------------------------------------------ timers
async def test_a_timer_fires_inside_the_leg(client: CellblockClient, scope: Scope) -> None:
    await _catalog(client, scope)
    code = "const t0 = Date.now(); await new Promise(r => setTimeout(r, 120)); return Date.now() - t0 >= 100;"
    result = await client.exec(scope, tool_call_id="t1", code=code, handlers={})
    assert (result.status, result.value) == ("completed", True), result.raw_json
    assert result.metadata.leg_count == 1


async def test_a_timer_fires_in_the_cell_free_part_of_a_wait(client: CellblockClient, scope: Scope) -> None:
    """A held timer fires in the cell-free part of the wait.

    A restart-safe leg parks with its timer held; the wait arms it, sees it fire (a
    ``TimerDue`` event) before any cell exists, then resumes the VM with its settlement.
    """
    await _catalog(client, scope)
    code = 'const t0 = Date.now(); await new Promise(r => setTimeout(r, 400)); return Date.now() - t0 >= 350;'
    run_id = await _parked_restart_safe(client, scope, "t2", code)
    parked = await client.get_run(scope, run_id)
    assert parked.state == "suspended"
    done = await client.wait(scope, tool_call_id="t2-w", run_id=run_id)
    assert (done.status, done.value) == ("completed", True), done.raw_json
    assert done.metadata.leg_count == 2


async def test_a_timer_pending_at_the_deadline_parks_the_run(client: CellblockClient, scope: Scope) -> None:
    """A pending timer is host work too: the leg parks at its deadline with the timer listed."""
    await _catalog(client, scope)
    first = await client.exec(scope, tool_call_id="t3", code='await new Promise(r => setTimeout(r, 60000)); return "never";', handlers={}, limits=SHORT)
    assert (first.status, first.reason) == ("waiting", "pending_tools"), first.raw_json
    assert [(p.id, p.method) for p in first.pending_tool_calls] == [("bridge:timer:1", "timer")]
    assert first.run_id and await client.cancel_run(scope, first.run_id) == "suspended"


# ------------------------------------------------------------------ held calls
async def test_a_call_made_after_a_yield_is_held_and_dispatched_by_the_next_wait(client: CellblockClient, scope: Scope) -> None:
    """Held-call dispatch after a yield (SPEC §10.4 item 1, §10.6 item 3).

    SPEC §10.4 item 1 and §10.6 item 3: a yield parks the leg at once; the call the program made
    right after it is not dispatched in that leg, and the wait dispatches it.
    """
    await _catalog(client, scope)
    calls: list[dict[str, Any]] = []

    async def counting_echo(tool_input: dict[str, Any], call: ToolCallInfo) -> dict[str, Any]:
        calls.append(tool_input)
        return {"details": tool_input}

    code = 'const y = yield_control("decide"); const c = tools.callValue("client:app:echo", {n: 1}); return [await y, await c];'
    first = await client.exec(scope, tool_call_id="h1", code=code, handlers={"echo": counting_echo})
    assert first.status == "waiting", first.raw_json
    assert [(p.id, p.method) for p in first.pending_tool_calls] == [("bridge:yield:1", "yield"), ("bridge:callValue:1", "callValue")]
    assert first.reason == "pending_tools"
    assert calls == [], "the call was held, not dispatched"
    done = await client.wait(scope, tool_call_id="h1-w", run_id=first.run_id, handlers={"echo": counting_echo})
    assert (done.status, done.value) == ("completed", [{"status": "yielded", "reason": "decide"}, {"n": 1}]), done.raw_json
    assert calls == [{"n": 1}]


async def test_restart_safe_run_holds_replay_safe_calls_until_the_wait(client: CellblockClient, scope: Scope) -> None:
    """Held-call dispatch of a restart-safe run (SPEC §10.8 item 2).

    SPEC §10.8 item 2: a restart-safe leg never auto-drains; it parks with the call held and the
    wait dispatches it, waits for it and resumes once.
    """
    await _catalog(client, scope)
    calls: list[dict[str, Any]] = []

    async def lookup(tool_input: dict[str, Any], call: ToolCallInfo) -> dict[str, Any]:
        calls.append(tool_input)
        return {"details": {"value": "v-" + tool_input["key"]}}

    first = await client.exec(scope, tool_call_id="h2", code='return await tools.callValue("host:core:lookup", {key: "k"});', handlers={"lookup": lookup}, force_restart_safe=True)
    assert (first.status, first.replay_safe) == ("waiting", True), first.raw_json
    assert calls == []
    done = await client.wait(scope, tool_call_id="h2-w", run_id=first.run_id, handlers={"lookup": lookup})
    assert (done.status, done.value, done.replay_safe) == ("completed", {"value": "v-k"}, True), done.raw_json
    assert calls == [{"key": "k"}]


async def test_restart_safe_run_refuses_a_call_that_is_not_replay_safe(client: CellblockClient, scope: Scope) -> None:
    await _catalog(client, scope)
    result = await client.exec(scope, tool_call_id="h3", code='return await tools.callValue("client:app:echo", {});', handlers={"echo": echo}, force_restart_safe=True)
    assert (result.status, result.code, result.failure_phase) == ("failed", "invalid_input", "host"), result.raw_json
    assert result.error == msg.r03("client:app:echo")


async def test_only_a_restart_safe_legs_guest_reports_idle(client: CellblockClient, scope: Scope, monkeypatch: pytest.MonkeyPatch) -> None:
    """The guest sends Idle only where the host decides on it (Start.idle_unneeded).

    Only a restart-safe run's leg parks on its guest's idle (SPEC §10.8 item 2); an ordinary
    leg's guest sends its requests and no Idle (one bridge write less per nested call), and its
    calls still settle and the run completes in one leg.
    """
    await _catalog(client, scope)
    seen: list[tuple[bool, str]] = []
    on_guest = Leg._on_guest

    def recording(leg: Leg, message: Any) -> Any:
        if message is not None:
            seen.append((leg.run_.restart_safe, message.WhichOneof("message")))
        return on_guest(leg, message)

    monkeypatch.setattr(Leg, "_on_guest", recording)
    code = 'let s = 0; for (let i = 1; i <= 3; i++) s += (await tools.callValue("client:app:echo", {i})).i; return s;'
    result = await client.exec(scope, tool_call_id="i1", code=code, handlers={"echo": echo})
    assert (result.status, result.value, result.metadata.leg_count) == ("completed", 6, 1), result.raw_json
    ordinary = [kind for safe, kind in seen if not safe]
    assert ordinary.count("request") == 3 and "idle" not in ordinary, ordinary
    await _parked_restart_safe(client, scope, "i2")
    assert (True, "idle") in seen, "a restart-safe leg's guest reports idle, and the leg parks on it"


# ------------------------------------------------------------------ abort
async def test_cancel_run_aborts_a_leg_in_its_cell_and_the_run_is_gone(client: CellblockClient, scope: Scope) -> None:
    await _catalog(client, scope)
    gate = Gate()

    async def cancel_when_called() -> str:
        await gate.called.wait()
        return await client.cancel_run(scope, gate.infos[0].run_id)

    canceller = asyncio.ensure_future(cancel_when_called())
    result = await client.exec(scope, tool_call_id="a1", code='return await tools.callValue("client:app:slow", {});', handlers={"slow": gate})
    assert await canceller == "running"
    assert (result.status, result.code, result.failure_phase) == ("failed", "aborted", "host"), result.raw_json
    assert result.error == msg.R07
    assert result.bridge_dispatch_started is True
    later = await client.wait(scope, tool_call_id="a1-w", run_id=gate.infos[0].run_id)
    assert (later.status, later.code, later.error) == ("failed", "aborted", msg.R07)


async def test_an_abort_sends_the_runtime_a_cancel_notice_for_each_dispatched_call(client: CellblockClient, service: Service, scope: Scope) -> None:
    """SPEC §3.6: an aborted leg tells the runtime about every call it dispatched that has no result.

    A raw Exec stream, not the Python client: the client cancels its handlers of any run that
    ends, which would hide whether the service sent the ``ToolCallCancelled`` notices.
    """
    await _catalog(client, scope)
    code = 'const a = tools.callValue("client:app:slow", {n: 1}); const b = tools.callValue("client:app:slow", {n: 2}); return [await a, await b];'
    start = cpb.ExecStart(scope=common_pb2.Scope(session_id=scope.session_id, agent_run_id=scope.agent_run_id), tool_call_id="a4", arguments_json=json.dumps({"code": code}))
    async with grpc.aio.insecure_channel(service.address) as channel:
        call = cpb_grpc.CodeModeServiceStub(channel).Exec()
        await call.write(cpb.ExecRequest(start=start))
        dispatched: list[str] = []
        cancelled: list[str] = []
        async for message in call:
            which = message.WhichOneof("message")
            if which == "tool_call":
                dispatched.append(message.tool_call.nested_call_id)
                if len(dispatched) == 2:
                    assert await client.cancel_run(scope, message.tool_call.run_id) == "running"
            elif which == "tool_call_cancelled":
                cancelled.append(message.tool_call_cancelled.nested_call_id)
            elif which == "result":
                assert message.result.code == cpb.ERROR_CODE_ABORTED, message.result
                break
    assert len(dispatched) == 2 and sorted(cancelled) == sorted(dispatched), (dispatched, cancelled)


async def test_cancel_run_aborts_the_cell_free_part_of_a_wait(client: CellblockClient, scope: Scope) -> None:
    await _catalog(client, scope)
    gate = Gate()
    run_id = await _parked_restart_safe(client, scope, "a2")
    waiting = asyncio.ensure_future(client.wait(scope, tool_call_id="a2-w", run_id=run_id, handlers={"lookup": gate}))
    await gate.called.wait()
    assert not waiting.done()
    assert await client.cancel_run(scope, run_id) == "running"
    result = await waiting
    assert (result.status, result.code, result.failure_phase, result.error) == ("failed", "aborted", "host", msg.R07), result.raw_json
    assert result.bridge_dispatch_started is True
    assert result.metadata.cell_id == "", "the wait was aborted before it started a cell"


async def test_the_end_of_the_scope_aborts_its_leg_with_r08(client: CellblockClient, scope: Scope) -> None:
    await _catalog(client, scope)
    gate = Gate()

    async def end_scope_when_called() -> None:
        await gate.called.wait()
        await client.delete_catalog(scope)

    ender = asyncio.ensure_future(end_scope_when_called())
    result = await client.exec(scope, tool_call_id="a3", code='return await tools.callValue("client:app:slow", {});', handlers={"slow": gate})
    await ender
    assert (result.status, result.code, result.failure_phase, result.error) == ("failed", "aborted", "host", msg.R08), result.raw_json


# ------------------------------------------------------------------ claims
async def test_claims_unknown_busy_and_other_scope(client: CellblockClient, service: Service, scope: Scope) -> None:
    """SPEC §10.6 item 1: a wait claims the run atomically; others get W03, W04 or W06.

    The refused waits come from a second client: the Python client sends the results of a run's
    running calls on that run's latest wait, which would be the refused one.
    """
    await _catalog(client, scope)
    unknown = await client.wait(scope, tool_call_id="w0", run_id="run_" + "0" * 32)
    assert (unknown.status, unknown.code, unknown.error) == ("failed", "invalid_input", msg.W03)
    gate = Gate()
    run_id = await _parked_restart_safe(client, scope, "w1")
    other = Scope(session_id=scope.session_id + "-other", agent_run_id=scope.agent_run_id)
    await _catalog(client, other)
    async with await CellblockClient.connect(service.address) as second:
        foreign = await second.wait(other, tool_call_id="w2", run_id=run_id)
        assert (foreign.code, foreign.error) == ("invalid_input", msg.W04)
        holder = asyncio.ensure_future(client.wait(scope, tool_call_id="w3", run_id=run_id, handlers={"lookup": gate}))
        await gate.called.wait()
        busy = await second.wait(scope, tool_call_id="w4", run_id=run_id)
        assert (busy.code, busy.error) == ("invalid_input", msg.W06)
    gate.open(0)
    done = await holder
    assert (done.status, done.value) == ("completed", {"answer": "late-1"}), done.raw_json
    gone = await client.wait(scope, tool_call_id="w5", run_id=run_id)
    assert (gone.code, gone.error) == ("invalid_input", msg.W03)
