"""Hostile programs in real cells: every limit holds, the service stays up (issue #3).

Each case runs in a real locked-down Docker cell and asserts the exact status
and code, an upper bound on wall time (only to catch hangs), and that the
service still answers a normal exec afterwards.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from cellblock.client import CellblockClient, LimitOverrides, Scope, Tool
from tests.support.cells import TIME_SCALE, leg_cells

pytestmark = pytest.mark.asyncio(loop_scope="session")

TIMEOUT_MS = int(2000 * TIME_SCALE)
LIMITS = LimitOverrides(timeout_ms=TIMEOUT_MS, memory_limit_bytes=32 * 1024 * 1024)
# Deadline + host watchdog grace + cell start and teardown on a loaded 2-core machine.
HANG_BOUND_S = TIMEOUT_MS / 1000 + 2 + 4 * TIME_SCALE

TOOLS = [
    Tool(source="host", owner="core", name="echo"),
    Tool(source="client", owner="app", name="blob"),
]


async def echo(tool_input: dict[str, Any], call: Any) -> dict[str, Any]:
    return {"details": tool_input}


async def _run(client: CellblockClient, scope: Scope, code: str, **kw: Any) -> tuple[Any, float]:
    await client.put_catalog(scope, TOOLS)
    started = time.monotonic()
    result = await client.exec(scope, tool_call_id="hostile", code=code, handlers=kw.pop("handlers", {"echo": echo}), limits=kw.pop("limits", LIMITS), **kw)
    return result, time.monotonic() - started


async def _still_serves(client: CellblockClient, scope: Scope) -> None:
    started = time.monotonic()
    result = await client.exec(scope, tool_call_id="after", code="return 40 + 2", handlers={})
    assert result.status == "completed" and result.value == 42, result.raw_json
    assert time.monotonic() - started < 5 * TIME_SCALE


TIMEOUTS = {
    "busy loop": "while (true) {}",
    "async loop": "for (;;) await null;",
    "loop in a promise job": "Promise.resolve().then(() => { for (;;) {} }); await new Promise(r => setTimeout(r, 100000));",
    "catastrophic regex": 'return /^(a+)+$/.test("a".repeat(40) + "b");',
}


@pytest.mark.parametrize("name", list(TIMEOUTS))
async def test_runaway_programs_time_out(client: CellblockClient, scope: Scope, name: str) -> None:
    result, elapsed = await _run(client, scope, TIMEOUTS[name])
    assert (result.status, result.code, result.failure_phase) == ("failed", "timeout", "host"), result.raw_json
    assert result.error.startswith("timeout exceeded:")
    assert elapsed < HANG_BOUND_S, f"{name} took {elapsed:.1f}s"
    await _still_serves(client, scope)


async def test_timer_storm_parks_at_the_deadline_instead_of_spinning(client: CellblockClient, scope: Scope) -> None:
    # Waiting on host work (a timer) at the deadline is not a timeout: the run parks (SPEC §10.9 item 3).
    result, elapsed = await _run(client, scope, "for (;;) { await new Promise(r => setTimeout(r, 0)); }")
    assert result.status == "waiting" and result.reason == "pending_tools", result.raw_json
    assert [p.method for p in result.pending_tool_calls] == ["timer"]
    assert elapsed < HANG_BOUND_S
    assert await client.cancel_run(scope, result.run_id) == "suspended"
    await _still_serves(client, scope)


MEMORY = {
    "object array growth": "const a = []; for (;;) a.push({x: a.length});",
    "caught out-of-memory": "const a = []; try { for (;;) a.push({x: 1}); } catch (e) { return 'survived'; }",
    "string repeat growth": "const a = []; for (;;) a.push('x'.repeat(1 << 16) + a.length);",
    "huge string repeats": "const keep = []; for (;;) keep.push('x'.repeat(2 ** 28));",
    "array buffers": "const a = []; for (;;) a.push(new ArrayBuffer(1 << 20));",
    "typed arrays": "const a = []; for (;;) a.push(new Float64Array(1 << 17).fill(1));",
    "huge join": "const parts = []; for (let i = 0; i < 5e6; i++) parts.push('xxxxxxxxxxxxxxxx'); return parts.join('-').length;",
}


@pytest.mark.parametrize("name", list(MEMORY))
async def test_memory_exhaustion_is_runtime_unavailable_with_the_limit(client: CellblockClient, scope: Scope, name: str) -> None:
    # A generous deadline: the limit, not the clock, must end these programs even on a loaded machine.
    result, elapsed = await _run(client, scope, MEMORY[name], limits=LimitOverrides(timeout_ms=int(8000 * TIME_SCALE), memory_limit_bytes=32 * 1024 * 1024))
    assert (result.status, result.code, result.failure_phase) == ("failed", "runtime_unavailable", "host"), result.raw_json
    assert result.error == (
        "cell memory exhausted: the program needed more than its 33554432-byte limit. Page through large tool results or keep less data in the cell."
        " Tool calls that already ran were not undone; check them before retrying."
    )
    assert elapsed < (8 + 2 + 4) * TIME_SCALE
    await _still_serves(client, scope)


async def test_deep_recursion_traps_the_engine(client: CellblockClient, scope: Scope) -> None:
    result, elapsed = await _run(client, scope, "function f(n) { return f(n + 1) + 1; } return f(0);")
    assert (result.status, result.code) == ("failed", "runtime_unavailable")
    assert result.error.startswith("cell engine stopped: recursion exhausted the engine's native stack.")
    assert elapsed < HANG_BOUND_S
    await _still_serves(client, scope)


FLOODS = {
    "console.log": 'for (let i = 0; i < 100000; i++) console.log("flood " + i); return "done";',
    "text": 'for (let i = 0; i < 100000; i++) text("x".repeat(100)); return "done";',
    "json": "for (let i = 0; i < 100000; i++) json({i, pad: 'y'.repeat(50)}); return 'done';",
}


@pytest.mark.parametrize("name", list(FLOODS))
async def test_output_floods_are_truncated_within_budget(client: CellblockClient, scope: Scope, name: str) -> None:
    limits = LimitOverrides(timeout_ms=int(8000 * TIME_SCALE), max_output_bytes=8192)
    result, _ = await _run(client, scope, FLOODS[name], limits=limits)
    assert result.status == "completed" and result.value == "done", result.raw_json[:300]
    output = json.loads(result.raw_json)["output"]
    assert output[-1]["type"] == "truncated" and output[-1]["omittedEntries"] > 90000
    sizes = sum(len(json.dumps(e, separators=(",", ":"), ensure_ascii=False).encode()) for e in output)
    assert sizes <= 8192 - 8192 // 4


async def test_huge_return_value_is_projected_not_failed(client: CellblockClient, scope: Scope) -> None:
    result, _ = await _run(client, scope, 'return "z".repeat(5 * 1024 * 1024);', limits=LimitOverrides(timeout_ms=int(8000 * TIME_SCALE), max_output_bytes=4096))
    assert result.status == "completed"
    value = json.loads(result.raw_json)["value"]
    assert value["truncated"] is True and value["omittedBytes"] > 5_000_000
    assert len(result.raw_json.encode()) < 8192


async def test_a_thousand_concurrent_tool_calls_hit_the_pending_cap(client: CellblockClient, scope: Scope) -> None:
    calls: list[Any] = []

    async def slow_echo(tool_input: dict[str, Any], call: Any) -> dict[str, Any]:
        calls.append(tool_input)
        await asyncio.sleep(0.05)
        return {"details": tool_input}

    code = """
const settled = await Promise.allSettled(Array.from({length: 1000}, (_, i) => tools.echo({i})));
const refused = settled.filter(s => s.status === "rejected");
return {ok: settled.length - refused.length, refused: refused.length, message: refused[0] && refused[0].reason.message};
"""
    result, _ = await _run(client, scope, code, handlers={"echo": slow_echo}, limits=LimitOverrides(timeout_ms=int(8000 * TIME_SCALE)))
    assert result.status == "completed", result.raw_json
    assert result.value == {"ok": 16, "refused": 984, "message": "too many pending host calls (limit 16); await some before starting more."}
    assert len(calls) == 16


async def test_oversized_tool_result_is_refused_in_the_guest(client: CellblockClient, scope: Scope) -> None:
    async def blob(tool_input: dict[str, Any], call: Any) -> dict[str, Any]:
        return {"details": "b" * (50 * 1024 * 1024)}

    code = 'try { await tools.callValue("client:app:blob", {}); return "accepted"; } catch (e) { return e.message; }'
    result, _ = await _run(client, scope, code, handlers={"blob": blob}, limits=LimitOverrides(timeout_ms=20000))
    assert result.status == "completed", result.raw_json[:300]
    assert result.value.startswith('Tool "client:app:blob" returned ')
    assert result.value.endswith("bytes, more than this cell accepts (10485760 bytes); ask for less data.")
    await _still_serves(client, scope)


async def test_oversized_request_is_refused_before_it_is_sent(client: CellblockClient, scope: Scope) -> None:
    code = 'try { await tools.echo({big: "q".repeat(2 * 1024 * 1024)}); return "sent"; } catch (e) { return e.message; }'
    result, _ = await _run(client, scope, code, limits=LimitOverrides(timeout_ms=int(8000 * TIME_SCALE), max_snapshot_bytes=1024 * 1024))
    assert result.value.startswith("this callValue request is ") and result.value.endswith("more than the bridge accepts (1048576 bytes); send less data.")


BRIDGE_VALUES = [
    ("cycle", "const o = {a: 1}; o.self = o; return await tools.echo({o: o})", None),
    ("bigint", "return await tools.echo({n: 10n})", "[object Object]"),  # JSON.stringify throws: String(value) (SPEC §8.8 rule 4)
    ("bare bigint", "return await tools.echo(10n)", "10"),
    ("nan and -0", "return await tools.echo({a: NaN, b: -0, c: Infinity})", {"a": None, "b": 0, "c": None}),
    ("lone surrogate", 'return await tools.echo({s: "\\ud800x"})', {"s": "\ud800x"}),
    ("proto keys", 'return await tools.echo(JSON.parse(\'{"__proto__": {"polluted": 1}, "constructor": 2}\'))', {"__proto__": {"polluted": 1}, "constructor": 2}),
    ("toJSON", "return await tools.echo({toJSON() { return {replaced: true}; }})", {"replaced": True}),
    ("proxy", "return await tools.echo(new Proxy({a: 1}, {get: (t, k) => (k === 'a' ? 2 : t[k])}))", {"a": 2}),
    ("function values", "return await tools.echo({f() {}, s: Symbol('x'), u: undefined, k: 1})", {"k": 1}),
]


@pytest.mark.parametrize(("name", "code", "expected"), BRIDGE_VALUES, ids=[b[0] for b in BRIDGE_VALUES])
async def test_only_json_crosses_the_bridge(client: CellblockClient, scope: Scope, name: str, code: str, expected: Any) -> None:
    seen: list[Any] = []

    async def recording_echo(tool_input: dict[str, Any], call: Any) -> dict[str, Any]:
        seen.append(tool_input)
        return {"details": tool_input}

    result, _ = await _run(client, scope, code, handlers={"echo": recording_echo})
    if expected is None:
        # A cyclic argument cannot become JSON: it crosses as its String() text.
        assert result.status == "completed" and seen == ["[object Object]"], (result.raw_json, seen)
    else:
        assert result.status == "completed", result.raw_json
        assert seen == [expected]
        assert result.value == expected


async def test_throwing_getters_fail_as_plain_guest_errors(client: CellblockClient, scope: Scope) -> None:
    code = "const o = {get x() { throw new Error('getter'); }, toString() { throw new Error('str'); }}; return await tools.echo(o);"
    result, _ = await _run(client, scope, code)
    assert (result.status, result.code, result.failure_phase) == ("failed", "internal_error", "guest"), result.raw_json
    assert result.error.startswith("TypeError: tools.callValue could not turn its argument into JSON or text.")
    await _still_serves(client, scope)


ESCAPES = [
    "return typeof constructor.constructor('return this')().process",
    "return typeof Function('return this')().require",
    "return Object.getOwnPropertyNames(globalThis).filter(n => /^(process|require|module|exports|fetch|XMLHttpRequest|WebSocket|std|os|Deno|Bun)$/.test(n)).join(',') || 'undefined'",
    "try { Error.prepareStackTrace = (e, sites) => sites.map(s => s.getFunction()); } catch (e) {} try { null.x } catch (e) { return Array.isArray(e.stack) ? 'hijacked' : typeof Error.prepareStackTrace; }",
    "return typeof (await (async () => {}).constructor('return globalThis.__cellblock_send')())",
    "try { return typeof (await import('os')); } catch (e) { return 'undefined'; }",
]


@pytest.mark.parametrize("code", ESCAPES)
async def test_escape_attempts_find_nothing(client: CellblockClient, scope: Scope, code: str) -> None:
    result, _ = await _run(client, scope, code)
    if result.status == "failed":
        # `import(...)` is refused before any cell starts (module access).
        assert result.code == "invalid_input" and result.failure_phase == "input", result.raw_json
    else:
        assert result.value == "undefined", result.raw_json


async def test_overwriting_bridge_globals_cannot_forge_results(client: CellblockClient, scope: Scope) -> None:
    code = """
JSON.parse = () => ({forged: true}); JSON.stringify = () => '"forged"';
Promise.prototype.then = function () { return 'forged'; };
Object.defineProperty = () => { throw new Error('no'); };
const r = await tools.echo({n: 1});
return r;
"""
    seen: list[Any] = []

    async def recording_echo(tool_input: dict[str, Any], call: Any) -> dict[str, Any]:
        seen.append(tool_input)
        return {"details": {"real": True}}

    result, _ = await _run(client, scope, code, handlers={"echo": recording_echo})
    # The guest broke its own JSON and Promise; the bridge still carried the real input,
    # and whatever the guest does with its broken built-ins, the host's record is exact.
    assert seen == [{"n": 1}], seen
    assert result.status in ("completed", "failed") and result.code in (None, "internal_error"), result.raw_json
    await _still_serves(client, scope)


CONTROLLER_ATTACKS = {
    "poisoned Object.prototype.toJSON": ("Object.prototype.toJSON = () => ({phase: 'fulfilled', hostWork: 0, valueJson: '\"forged\"'}); return 1;", 1),
    "poisoned Map.prototype.forEach": ("Map.prototype.forEach = function () { throw new Error('x'); }; return 1;", 1),
    "getter on Object.prototype": ("Object.defineProperty(Object.prototype, 'phase', {get() { return 'forged'; }, set() {}}); return 1;", 1),
    "lone surrogates flood the output": ('text("\\ud800".repeat(100000)); return "ok";', "ok"),
    "deleted globals": ("delete globalThis.JSON; delete globalThis.Promise; delete globalThis.Object; return 2;", 2),
}


@pytest.mark.parametrize("name", list(CONTROLLER_ATTACKS))
async def test_guest_cannot_break_the_controller(client: CellblockClient, scope: Scope, name: str) -> None:
    code, expected = CONTROLLER_ATTACKS[name]
    result, elapsed = await _run(client, scope, code, limits=LimitOverrides(timeout_ms=5000))
    assert result.status == "completed" and result.value == expected, result.raw_json
    assert elapsed < 5 + 2 + 4
    await _still_serves(client, scope)


async def test_snapshot_hands_the_controller_to_no_guest_setter(client: CellblockClient, scope: Scope) -> None:
    code = """
let stolen = 'nothing';
Object.defineProperty(globalThis, '__cellblock_controller_restore', {set(v) { stolen = v; }, get() { return stolen; }, configurable: false});
Object.setPrototypeOf(globalThis, new Proxy({}, {set(t, k, v) { stolen = v; return true; }}));
await yield_control('x');
return typeof stolen;
"""
    first, _ = await _run(client, scope, code)
    assert first.status == "waiting", first.raw_json
    done = await client.wait(scope, tool_call_id="steal-w", run_id=first.run_id)
    assert done.status == "completed" and done.value == "string", done.raw_json


async def test_memory_exhaustion_while_serialising_a_tool_argument_calls_no_tool(client: CellblockClient, scope: Scope) -> None:
    seen: list[Any] = []

    async def recording_echo(tool_input: dict[str, Any], call: Any) -> dict[str, Any]:
        seen.append(tool_input)
        return {"details": "called"}

    code = "const r = await tools.echo({s: 'q'.repeat(9 * 1024 * 1024)}); return r;"
    result, _ = await _run(client, scope, code, handlers={"echo": recording_echo}, limits=LimitOverrides(timeout_ms=int(8000 * TIME_SCALE), memory_limit_bytes=32 * 1024 * 1024))
    assert seen == [], "the tool must not run with a corrupted argument"
    assert (result.status, result.code) == ("failed", "runtime_unavailable"), result.raw_json


async def test_client_disconnect_mid_exec_aborts_and_removes_the_cell(client: CellblockClient, scope: Scope, service: Any) -> None:
    await client.put_catalog(scope, TOOLS)
    task = asyncio.ensure_future(client.exec(scope, tool_call_id="gone", code="while (true) {}", handlers={}, limits=LimitOverrides(timeout_ms=30000)))
    await asyncio.sleep(2.0)
    assert leg_cells(service), "the cell should be running"
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    for _ in range(50):
        if not leg_cells(service):
            break
        await asyncio.sleep(0.2)
    assert leg_cells(service) == []
    await _still_serves(client, scope)


async def test_twenty_hostile_programs_at_once_leave_the_service_healthy(client: CellblockClient, scope: Scope, service: Any) -> None:
    await client.put_catalog(scope, TOOLS)
    await _still_serves(client, scope)
    rss_before = _rss_kib()
    programs = (list(TIMEOUTS.values()) + list(MEMORY.values()) + list(FLOODS.values()))[:20]
    while len(programs) < 20:
        programs.append("while (true) {}")

    async def one(i: int, code: str) -> Any:
        try:
            return await client.exec(scope, tool_call_id=f"h{i}", code=code, handlers={"echo": echo}, limits=LIMITS)
        except Exception as exc:  # noqa: BLE001 - admission control may refuse some
            return exc

    results = await asyncio.gather(*(one(i, code) for i, code in enumerate(programs)))
    statuses = [f"{type(r).__name__}: {r}" if isinstance(r, Exception) else r.status for r in results]
    refused = [s for s in statuses if s.startswith("ResourceExhaustedError")]
    assert [s for s in statuses if s not in ("failed", "completed") and s not in refused] == [], statuses
    # Admission control runs at most 16 legs at once, 12 of them of one scope, and refuses the rest clearly.
    per_scope = "this scope already has 12 legs running, its most on this instance (of 16 legs in all); retry when one ends"
    assert len(refused) <= 8 and all("too many legs are running on this instance (limit 16); retry shortly" in s or per_scope in s for s in refused)
    started = time.monotonic()
    await _still_serves(client, scope)
    assert time.monotonic() - started < 2.0
    assert leg_cells(service) == []
    current = _rss_kib()
    assert current - rss_before < 50 * 1024, f"server memory grew by {(current - rss_before) // 1024} MiB"


def _rss_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0
