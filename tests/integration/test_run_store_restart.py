"""Suspended runs survive a SIGKILLed service: a new process on the same store completes them (SPEC §16.1 item 3).

A real service process (``python -m cellblock.server``, Docker cells) parks six
runs of different kinds, some with tool results still outstanding in the client,
and is SIGKILLed. A new process on the same store and address serves the waits;
every run completes with the right value. Once on SQLite (the default) and once
on a real PostgreSQL.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from cellblock.client import CellblockClient, LimitOverrides, RunResult, Scope, Tool
from tests.support.service_process import ServiceProcess

pytestmark = pytest.mark.asyncio(loop_scope="session")

TOOLS = [Tool(source="client", owner="app", name="slow", description="Answers n when the test opens gate n.", parameters={"type": "object"})]
#: Reconnect quickly to the restarted service on the same address.
FAST_RECONNECT = [("grpc.initial_reconnect_backoff_ms", 200), ("grpc.min_reconnect_backoff_ms", 200), ("grpc.max_reconnect_backoff_ms", 500)]
LIMITS = LimitOverrides(timeout_ms=5000)


class Gates:
    """A handler whose call with input ``{n}`` answers ``{"answer": n}`` once gate n is open."""

    def __init__(self) -> None:
        self.events: dict[int, asyncio.Event] = {}
        self.calls: list[tuple[int, str]] = []

    def gate(self, n: int) -> asyncio.Event:
        return self.events.setdefault(n, asyncio.Event())

    async def __call__(self, tool_input: dict[str, Any], call: Any) -> dict[str, Any]:
        n = int(tool_input["n"])
        self.calls.append((n, call.nested_call_id))
        await self.gate(n).wait()
        return {"details": {"answer": n}}


PROGRAMS: dict[str, tuple[str, Any]] = {
    # A result that completes in the client while no service runs.
    "late": ('const r = await tools.callValue("client:app:slow", {n: 1}); return r.answer * 10;', 10),
    # A result that arrives on the wait stream of the new process.
    "live": ('const r = await tools.callValue("client:app:slow", {n: 2}); return r.answer * 10;', 20),
    # The new process dispatches the run's second call (the nested-call counter continues).
    "two": ('const a = await tools.callValue("client:app:slow", {n: 3}); const b = await tools.callValue("client:app:slow", {n: 4}); return [a.answer, b.answer];', [3, 4]),
    "yield": ('const r = await yield_control("checkpoint"); return r;', {"status": "yielded", "reason": "checkpoint"}),
    "timer": ('const t0 = Date.now(); await new Promise((r) => setTimeout(r, 6000)); return Date.now() - t0 >= 5900;', True),
    # Closures, output order and the output budget across the restart.
    "state": (
        'let acc = [1, 2]; const bump = () => acc.push(acc.length + 1); console.log("before");'
        ' const r = await tools.callValue("client:app:slow", {n: 6}); bump(); acc.push(r.answer); console.log("after"); return acc;',
        [1, 2, 3, 6],
    ),
}


async def _until_up(client: CellblockClient, scope: Scope, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await client.list_runs(scope)
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.3)


async def _complete(client: CellblockClient, scope: Scope, name: str, first: RunResult, gates: Gates, outputs: list[str]) -> RunResult:
    result, n = first, 0
    while result.status == "waiting":
        n += 1
        assert n <= 6, f"{name}: still waiting after {n} waits"
        assert result.run_id is not None
        result = await client.wait(scope, tool_call_id=f"{name}-w{n}", run_id=result.run_id, handlers={"slow": gates}, on_output=lambda e: outputs.append(e.text))
    return result


async def test_sigkilled_service_with_six_suspended_runs_then_a_new_process_completes_them(durable_store_url: str, process_sockets: str) -> None:
    gates = Gates()
    gates.gate(4).set()  # the second call of "two" answers at once, on the new process
    a = ServiceProcess(durable_store_url, process_sockets).start()
    b = ServiceProcess(durable_store_url, process_sockets, port=a.port)
    scope = Scope(session_id="restart-session", agent_run_id="agent-1")
    outputs: dict[str, list[str]] = {name: [] for name in PROGRAMS}
    try:
        async with await CellblockClient.connect(a.address, channel_options=FAST_RECONNECT) as client:
            await client.put_catalog(scope, TOOLS)
            first: dict[str, RunResult] = {}
            for batch in (list(PROGRAMS)[:3], list(PROGRAMS)[3:]):
                results = await asyncio.gather(
                    *(client.exec(scope, tool_call_id=f"{n}-exec", code=PROGRAMS[n][0], handlers={"slow": gates}, limits=LIMITS, on_output=lambda e, n=n: outputs[n].append(e.text)) for n in batch)
                )
                first.update(zip(batch, results, strict=True))
            assert {n: r.status for n, r in first.items()} == dict.fromkeys(PROGRAMS, "waiting"), {n: r.raw_json for n, r in first.items()}
            before = {r.run_id: r for r in (await client.list_runs(scope)).runs}
            assert set(before) == {r.run_id for r in first.values()} and all(r.state == "suspended" for r in before.values())

            a.kill()
            gates.gate(1).set()  # completes in the client while no service is up
            gates.gate(3).set()
            await asyncio.sleep(0.5)
            b.start()

            after = {r.run_id: r for r in (await _until_up(client, scope)).runs}
            assert set(after) == set(before), "every suspended run survived the SIGKILL"
            for run_id, run in after.items():
                assert run.state == "suspended" and run.expire_time == before[run_id].expire_time, "expiresAt unchanged"
                assert run.snapshot_bytes == before[run_id].snapshot_bytes > 0

            async def open_live_later() -> None:
                await asyncio.sleep(1.0)
                gates.gate(2).set()
                gates.gate(6).set()

            opener = asyncio.ensure_future(open_live_later())
            done = await asyncio.gather(*(_complete(client, scope, n, first[n], gates, outputs[n]) for n in PROGRAMS))
            await opener
            for name, result in zip(PROGRAMS, done, strict=True):
                assert result.status == "completed", f"{name}: {result.raw_json}"
                assert result.value == PROGRAMS[name][1], name
            assert outputs["state"] == ["before", "after"]
            nested = dict(gates.calls)
            assert nested[4].endswith("_2") and nested[3].endswith("_1"), "the nested-call counter continues on the new process"
            assert (await client.list_runs(scope)).runs == [], "completed runs left the store"
    finally:
        a.kill()
        b.stop()
        log = b.log_tail()
        a.close()
        b.close()
    assert "Traceback" not in log, log


@pytest.mark.parametrize(
    ("store", "reason"),
    [
        ("postgresql://postgres@/cellblock?host=/nonexistent-socket-dir", "cannot open the PostgreSQL run store"),
        ("redis://localhost/0", "names no run store"),
        ("sqlite:///proc/cellblock/runs.sqlite3", "cannot create the run store's directory"),
    ],
)
async def test_an_unusable_store_stops_the_service_at_start(store: str, reason: str, process_sockets: str) -> None:
    service = ServiceProcess(store, process_sockets)
    with pytest.raises(RuntimeError, match="the service exited with 1") as failure:
        service.start(timeout=30)
    assert "cellblock: the run store is unavailable" in str(failure.value) and reason in str(failure.value)
    service.close()


async def test_a_sigterm_mid_wait_keeps_the_run_resumable_after_the_restart(process_sockets: str, tmp_path: Any) -> None:
    """A graceful stop (a rolling update's SIGTERM) is not the caller's abort: the run resumes from its last park."""
    import signal  # noqa: PLC0415

    store = "sqlite:///" + str(tmp_path / "runs.sqlite3").lstrip("/")
    service = ServiceProcess(store, process_sockets, code_mode={"enabled": True, "timeoutMs": 3000}).start()
    scope = Scope("s-term", "agent")
    gates = Gates()
    code = """
    let first;
    try { first = (await tools.callValue("client:app:slow", {n: 1})).answer; } catch (e) { return "lost: " + e.message; }
    const second = await tools.callValue("client:app:slow", {n: 2});
    return [first, second.answer];
    """
    try:
        async with await CellblockClient.connect(service.address, channel_options=FAST_RECONNECT) as client:
            await client.put_catalog(scope, TOOLS)
            parked = await client.exec(scope, tool_call_id="term", code=code, handlers={"slow": gates}, limits=LimitOverrides(timeout_ms=3000))
            assert parked.status == "waiting" and parked.run_id is not None, parked.raw_json
            gates.gate(1).set()
            leg = asyncio.ensure_future(client.wait(scope, tool_call_id="term-w1", run_id=parked.run_id, handlers={"slow": gates}))
            deadline = time.monotonic() + 30
            while not any(n == 2 for n, _ in gates.calls):
                assert time.monotonic() < deadline, "call 2 was never dispatched"
                await asyncio.sleep(0.1)
            assert service.proc is not None
            service.proc.send_signal(signal.SIGTERM)
            with pytest.raises(Exception, match="shutting down"):  # noqa: B017 - UNAVAILABLE, not a terminal result
                await leg
            assert service.proc.wait(30) == 0
            service.start()
            await _until_up(client, scope)
            await client.put_catalog(scope, TOOLS)
            assert [r.run_id for r in (await client.list_runs(scope)).runs] == [parked.run_id], "the run survived the graceful stop"
            resumed = await client.wait(scope, tool_call_id="term-w2", run_id=parked.run_id, handlers={"slow": gates})
            assert resumed.status == "completed", resumed.raw_json
            assert resumed.value == "lost: cell runtime unavailable: the cell exited with code 137.", "resumed from the last park at once, the lost leg's call rejected"
    finally:
        service.kill()
        service.close()
