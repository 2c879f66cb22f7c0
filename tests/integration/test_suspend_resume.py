"""Suspend and resume with real VM snapshots in fresh Docker cells (issue #4)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from cellblock.client import CellblockClient, LimitOverrides, Scope, Tool
from cellblock.server.app import Service
from cellblock.server.store import SqliteRunStore
from tests.support.cells import leg_cells

pytestmark = pytest.mark.asyncio(loop_scope="session")

TOOLS = [
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
SHORT = LimitOverrides(timeout_ms=3000)  # generous: cell start counts against the deadline


class Gate:
    """A handler whose calls finish only when the test opens them, in order."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.gates: list[asyncio.Event] = []

    async def __call__(self, tool_input: dict[str, Any], call: Any) -> dict[str, Any]:
        index = len(self.calls)
        self.calls.append(tool_input)
        while len(self.gates) <= index:
            self.gates.append(asyncio.Event())
        await self.gates[index].wait()
        return {"details": {"answer": f"late-{index + 1}", "input": tool_input}}

    def open(self, index: int) -> None:
        while len(self.gates) <= index:
            self.gates.append(asyncio.Event())
        self.gates[index].set()


async def _catalog(client: CellblockClient, scope: Scope) -> None:
    await client.put_catalog(scope, TOOLS)


def _cells(service: Service) -> list[str]:
    return leg_cells(service)


async def test_late_result_suspends_without_a_cell_and_wait_completes(client: CellblockClient, scope: Scope, service: Service) -> None:
    await _catalog(client, scope)
    gate = Gate()
    code = 'const r = await tools.callValue("client:app:slow", {q: 1}); return r.answer + "!";'
    first = await client.exec(scope, tool_call_id="s1", code=code, handlers={"slow": gate}, limits=SHORT)
    assert first.status == "waiting", first.raw_json
    assert first.reason == "pending_tools"
    assert [(p.id, p.method) for p in first.pending_tool_calls] == [("bridge:callValue:1", "callValue")]
    assert first.run_id and first.run_id.startswith("run_") and len(first.run_id) == 36
    assert _cells(service) == [], "no cell may be held while the run waits"
    run = await client.get_run(scope, first.run_id)
    assert run.state == "suspended" and run.snapshot_bytes > 0 and run.expire_time is not None
    gate.open(0)
    done = await client.wait(scope, tool_call_id="s1-wait", run_id=first.run_id, handlers={"slow": gate})
    assert done.status == "completed", done.raw_json
    assert done.value == "late-1!"
    assert gate.calls == [{"q": 1}]


async def test_three_cycles_keep_closures_maps_classes_promises_dates_and_output_order(client: CellblockClient, scope: Scope) -> None:
    await _catalog(client, scope)
    gate = Gate()
    code = """
const counter = (() => { let n = 0; return () => ++n; })();
const seen = new Map();
class Acc { constructor() { this.items = []; } add(x) { this.items.push(x); return this; } }
const acc = new Acc();
let resolveLater; const later = new Promise(r => { resolveLater = r; });
const times = [Date.now()];
for (let i = 1; i <= 3; i++) {
  console.log("before " + i);
  const r = await tools.callValue("client:app:slow", {i});
  seen.set(i, r.answer); acc.add(counter()); times.push(Date.now());
  console.log("after " + i);
}
resolveLater("kept");
return {count: counter(), seen: [...seen], items: acc.items, isAcc: acc instanceof Acc,
        later: await later, monotonic: times.every((t, i) => i === 0 || t >= times[i - 1])};
"""
    outputs: list[str] = []
    result = await client.exec(scope, tool_call_id="s2", code=code, handlers={"slow": gate}, limits=SHORT, on_output=lambda e: outputs.append(e.text))
    legs = 1
    while result.status == "waiting":
        assert legs <= 4
        gate.open(legs - 1)
        result = await client.wait(scope, tool_call_id=f"s2-w{legs}", run_id=result.run_id, handlers={"slow": gate}, on_output=lambda e: outputs.append(e.text))
        legs += 1
    assert result.status == "completed", result.raw_json
    assert legs == 4, "each of the three late calls suspends the run once"
    assert result.value == {
        "count": 4,
        "seen": [[1, "late-1"], [2, "late-2"], [3, "late-3"]],
        "items": [1, 2, 3],
        "isAcc": True,
        "later": "kept",
        "monotonic": True,
    }
    assert outputs == ["before 1", "after 1", "before 2", "after 2", "before 3", "after 3"]
    assert result.metadata.leg_count == 4


async def test_yield_control_round_trip(client: CellblockClient, scope: Scope) -> None:
    await _catalog(client, scope)
    first = await client.exec(scope, tool_call_id="s3", code='const y = await yield_control("need a decision"); return y;', handlers={})
    assert first.status == "waiting" and first.reason == "yield"
    assert [(p.id, p.method) for p in first.pending_tool_calls] == [("bridge:yield:1", "yield")]
    done = await client.wait(scope, tool_call_id="s3-w", run_id=first.run_id)
    assert done.status == "completed" and done.value == {"status": "yielded", "reason": "need a decision"}


async def _suspended(client: CellblockClient, scope: Scope, tool_call_id: str) -> str:
    result = await client.exec(scope, tool_call_id=tool_call_id, code='return await yield_control("x");', handlers={})
    assert result.status == "waiting", result.raw_json
    assert result.run_id
    return result.run_id


async def test_wait_from_another_scope_fails_and_the_owner_still_resumes(client: CellblockClient, scope: Scope) -> None:
    await _catalog(client, scope)
    run_id = await _suspended(client, scope, "s4")
    other_session = Scope(session_id=scope.session_id + "-other", agent_run_id=scope.agent_run_id)
    other_agent = Scope(session_id=scope.session_id, agent_run_id=scope.agent_run_id + "-other")
    r1 = await client.wait(other_session, tool_call_id="x1", run_id=run_id)
    assert (r1.status, r1.code, r1.failure_phase) == ("failed", "invalid_input", "input")
    assert r1.error == "this run belongs to a different session; only the session that started it can wait on it."
    r2 = await client.wait(other_agent, tool_call_id="x2", run_id=run_id)
    assert r2.error == "this run belongs to a different agent run; only the agent run that started it can wait on it."
    done = await client.wait(scope, tool_call_id="s4-w", run_id=run_id)
    assert done.status == "completed"


async def test_two_concurrent_waits_exactly_one_resumes(client: CellblockClient, scope: Scope) -> None:
    await _catalog(client, scope)
    run_id = await _suspended(client, scope, "s5")
    a, b = await asyncio.gather(
        client.wait(scope, tool_call_id="w-a", run_id=run_id),
        client.wait(scope, tool_call_id="w-b", run_id=run_id),
    )
    statuses = sorted([a.status, b.status])
    assert statuses == ["completed", "failed"], (a.raw_json, b.raw_json)
    loser = a if a.status == "failed" else b
    assert loser.error == "this run is already being resumed by another wait; let that call return first."


async def test_unknown_expired_and_cancelled_runs(client: CellblockClient, scope: Scope) -> None:
    await _catalog(client, scope)
    unknown = await client.wait(scope, tool_call_id="u", run_id="run_" + "0" * 32)
    assert unknown.error == "this run is unknown or has expired; start a new exec instead of waiting."
    missing = await client.wait(scope, tool_call_id="u2", arguments={"runId": "  "})
    assert missing.error == "runId must be a non-empty string."

    expiring = await client.exec(scope, tool_call_id="e", code='return await yield_control();', handlers={}, limits=LimitOverrides(snapshot_ttl_seconds=1))
    assert expiring.status == "waiting"
    await asyncio.sleep(1.3)
    expired = await client.wait(scope, tool_call_id="e-w", run_id=expiring.run_id)
    assert expired.code == "invalid_input" and expired.error.startswith("this run is unknown or has expired")

    run_id = await _suspended(client, scope, "c")
    assert await client.cancel_run(scope, run_id) == "suspended"
    cancelled = await client.wait(scope, tool_call_id="c-w", run_id=run_id)
    assert (cancelled.status, cancelled.code, cancelled.failure_phase) == ("failed", "aborted", "host")
    assert cancelled.error == "execution aborted by the caller; the cell was stopped and this run cannot be resumed."


async def test_suspended_run_cap_refuses_the_65th(client: CellblockClient, scope: Scope, service: Service) -> None:
    await _catalog(client, scope)
    store = service.registry.store
    held = (await store.counts())[0]
    fillers = [f"run_filler_{i}" for i in range(64 - held)]
    for i, run_id in enumerate(fillers):  # 64 runs of two scopes (each under its share, 48) hold slots in the deployment's store
        assert await store.reserve_slot(run_id, "filler", f"filler-{i % 2}", 1.0, "filler-lease", 600)
    try:
        result = await client.exec(scope, tool_call_id="cap", code='return await yield_control();', handlers={})
        assert (result.status, result.code, result.failure_phase) == ("failed", "runtime_unavailable", "host")
        assert result.error == "too many runs are suspended or waiting on tools in this cellblock deployment (limit 64); finish waiting runs before starting new ones."
        called: list[Any] = []
        result = await client.exec(scope, tool_call_id="cap2", code='return await tools.callValue("client:app:slow", {});', handlers={"slow": lambda i, c: called.append(i)})
        assert (result.code, result.failure_phase) == ("runtime_unavailable", "host") and result.bridge_dispatch_started is False
        assert result.error.startswith("too many runs are suspended or waiting on tools"), result.error
        assert called == [], "nothing may be dispatched without a slot"
        assert (await store.counts())[0] == 64
    finally:
        for run_id in fillers:
            await store.remove(run_id, "filler-lease")


async def test_snapshot_over_the_cap_fails_with_its_size(client: CellblockClient, scope: Scope) -> None:
    await _catalog(client, scope)
    code = 'const big = "x".repeat(200000) + Math.random(); await yield_control(); return big.length;'
    result = await client.exec(scope, tool_call_id="snap", code=code, handlers={}, limits=LimitOverrides(max_snapshot_bytes=4096))
    assert (result.status, result.code, result.failure_phase) == ("failed", "snapshot_limit_exceeded", "host")
    assert result.error.startswith("snapshot limit exceeded: the suspended program needs ")
    assert result.error.endswith("bytes, more than maxSnapshotBytes (4096). Keep less data alive across awaits.")


async def test_promise_pending_without_host_work_fails_at_once(client: CellblockClient, scope: Scope) -> None:
    await _catalog(client, scope)
    started = time.monotonic()
    result = await client.exec(scope, tool_call_id="never", code="await new Promise(() => {}); return 1;", handlers={})
    assert (result.status, result.code, result.failure_phase) == ("failed", "internal_error", "guest")
    assert result.error == "the program's result can never settle: its promise is still pending, but no tool call, timer or yield is outstanding."
    assert time.monotonic() - started < 8, "must fail at once, not at the deadline"


async def test_restart_safe_refuses_unsafe_calls_and_parks_safe_ones(client: CellblockClient, scope: Scope) -> None:
    await _catalog(client, scope)
    called: list[Any] = []

    async def slow(tool_input: dict[str, Any], call: Any) -> dict[str, Any]:
        called.append(tool_input)
        return {"details": "x"}

    refused = await client.exec(scope, tool_call_id="rs1", arguments={"code": 'return await tools.callValue("client:app:slow", {});', "restartSafe": True}, handlers={"slow": slow})
    assert (refused.status, refused.code, refused.failure_phase) == ("failed", "invalid_input", "host")
    assert refused.error == 'restartSafe runs may only make replay-safe read calls, and "client:app:slow" is not replay-safe; nothing was called. Run it again without restartSafe.'
    assert called == [] and refused.bridge_dispatch_started is False

    async def lookup(tool_input: dict[str, Any], call: Any) -> dict[str, Any]:
        return {"details": {"value": tool_input["key"].upper()}}

    code = 'const a = await tools.callValue("host:core:lookup", {key: "a"}); return a.value;'
    parked = await client.exec(scope, tool_call_id="rs2", arguments={"code": code, "restartSafe": True}, handlers={"lookup": lookup})
    assert parked.status == "waiting" and parked.replay_safe is True, parked.raw_json
    done = await client.wait(scope, tool_call_id="rs2-w", run_id=parked.run_id, handlers={"host:core:lookup": lookup})
    assert done.status == "completed" and done.value == "A" and done.replay_safe is True


async def test_snapshot_from_another_engine_build_is_refused(client: CellblockClient, scope: Scope, service: Service) -> None:
    await _catalog(client, scope)
    run_id = await _suspended(client, scope, "build")
    store = service.registry.store
    assert isinstance(store, SqliteRunStore)
    # As if made by another cell image: the build id stored with the snapshot differs.
    await store.call(lambda c: c.execute("UPDATE cellblock_runs SET engine_build_id = ? WHERE run_id = ?", ("0" * 64, run_id)))
    result = await client.wait(scope, tool_call_id="build-w", run_id=run_id)
    assert (result.status, result.code) == ("failed", "runtime_unavailable")
    assert result.error == "cell runtime unavailable: the suspended program was made by a different cell image and cannot be restored here."
    assert json.loads(result.raw_json)["failurePhase"] == "host"


async def test_a_yields_first_suspension_is_one_store_write(client: CellblockClient, scope: Scope, service: Service, monkeypatch: pytest.MonkeyPatch) -> None:
    # The first suspension takes the run's slot (SPEC §10.7 item 3) in its park's transaction
    # (§10.4 "Parking"): one durable write on the way to `waiting`, not a reservation and a park.
    await _catalog(client, scope)
    store = service.registry.store
    writes: list[str] = []
    for name in ("reserve_slot", "park", "park_with_slot"):
        real = getattr(store, name)

        async def spy(*args: Any, _real: Any = real, _name: str = name) -> Any:
            writes.append(_name)
            return await _real(*args)

        monkeypatch.setattr(store, name, spy)
    held = (await store.counts())[0]
    parked = await client.exec(scope, tool_call_id="early", code="await yield_control(); return 'resumed';", handlers={})
    assert parked.status == "waiting", parked.raw_json
    assert writes == ["park_with_slot"], writes
    record = await store.get(parked.run_id)
    assert record is not None and (record.state, record.holds_slot) == ("suspended", True)
    assert (await store.counts())[0] == held + 1
    done = await client.wait(scope, tool_call_id="early-w", run_id=parked.run_id)
    assert (done.status, done.value) == ("completed", "resumed"), done.raw_json
    assert (await store.counts())[0] == held


async def test_a_snapshot_over_the_cap_holds_no_slot_afterwards(client: CellblockClient, scope: Scope, service: Service) -> None:
    await _catalog(client, scope)
    held = (await service.registry.store.counts())[0]
    code = 'const big = "x".repeat(200000) + Math.random(); await yield_control(); return big.length;'
    result = await client.exec(scope, tool_call_id="snap-slot", code=code, handlers={}, limits=LimitOverrides(max_snapshot_bytes=4096))
    assert result.code == "snapshot_limit_exceeded", result.raw_json
    assert (await service.registry.store.counts())[0] == held, "a refused snapshot leaves no slot taken"


async def test_nested_calls_go_out_in_request_order_while_the_slot_answer_is_on_its_way(client: CellblockClient, scope: Scope, service: Service, monkeypatch: pytest.MonkeyPatch) -> None:
    # The store's answer marks the run as holding its slot before SlotReserved reaches the
    # settle loop; a call that arrived in that gap went out ahead of the first one (the
    # conformance table's suspend_resume saw nested call 1 carry the second call's input).
    await _catalog(client, scope)
    real_reserve = service.registry.reserve_slot

    async def reserve(run: Any) -> bool:
        granted = await real_reserve(run)
        await asyncio.sleep(0.4)  # a slow store reply: the run holds its slot, the leg does not know yet
        return granted

    monkeypatch.setattr(service.registry, "reserve_slot", reserve)
    seen: list[tuple[int, int]] = []

    async def echo(tool_input: dict[str, Any], call: Any) -> dict[str, Any]:
        seen.append((tool_input["i"], int(call.nested_call_id.rsplit("_", 1)[1])))
        return {"details": {"i": tool_input["i"]}}

    code = """
const first = tools.callValue("client:app:slow", { i: 1 });
await new Promise((resolve) => setTimeout(resolve, 150));
const second = tools.callValue("client:app:slow", { i: 2 });
return [(await first).i, (await second).i];
"""
    done = await client.exec(scope, tool_call_id="order", code=code, handlers={"slow": echo}, limits=SHORT)
    assert (done.status, done.value) == ("completed", [1, 2]), done.raw_json
    assert seen == [(1, 1), (2, 2)], "nested calls are numbered and sent in the guest's order"
