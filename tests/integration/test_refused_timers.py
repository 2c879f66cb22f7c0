"""A timer refused at the pending cap is a guest-visible error, never [R04] (SPEC §8.9 item 3).

Real service, real cells, ``maxPendingToolCalls: 1``: a tool call smuggled from inside the
serialisation of another call's input (a ``toJSON``, a getter, a Proxy) is taken first, the
host refuses the outer call ([B24]); the program then starts a timer while the smuggled call
still runs. The timer is host work and counts toward the cap, so ``setTimeout`` throws [B13]
at once; a program that lets it escape ends with that error (``internal_error``, phase
``bridge``), one that waits for the smuggled call first gets its timer.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from cellblock.client import CellblockClient, LimitOverrides, Scope, Tool
from cellblock.server import messages as msg

pytestmark = pytest.mark.asyncio(loop_scope="session")

B13 = "too many pending host calls (limit 1); await some before starting more."

#: Each builds ``a``, an input whose serialisation starts one smuggled call kept in ``inner``.
SMUGGLERS = {
    "toJSON": 'const a = {toJSON() { if (k++ < 1) inner = tools.callValue("host:core:slow", {}).catch(() => {}); return {}; }};',
    "getter": 'const a = {get x() { if (k++ < 1) inner = tools.callValue("host:core:slow", {}).catch(() => {}); return 1; }};',
    "proxy": 'const a = new Proxy({x: 1}, {get(t, p) { if (p === "x" && k++ < 1) inner = tools.callValue("host:core:slow", {}).catch(() => {}); return t[p]; }});',
}


async def _run(client: CellblockClient, scope: Scope, name: str, code: str) -> Any:
    await client.put_catalog(scope, [Tool(source="host", owner="core", name="slow")])

    async def slow(tool_input: Any, call: Any) -> Any:
        await asyncio.sleep(0.3)
        return {"details": "slow"}

    limits = LimitOverrides(max_pending_tool_calls=1, timeout_ms=8000)
    return await client.exec(scope, tool_call_id=name, code=code, handlers={"slow": slow}, limits=limits)


@pytest.mark.parametrize("smuggler", sorted(SMUGGLERS))
async def test_a_timer_refused_after_a_smuggled_call_is_b13_not_r04(client: CellblockClient, scope: Scope, smuggler: str) -> None:
    code = "let k = 0; let inner = null;\n" + SMUGGLERS[smuggler] + """
        let outer = "";
        try { await tools.callValue("host:core:slow", a); } catch (e) { outer = e.message; }
        let timer = "";
        try { setTimeout(() => {}, 1500); timer = "started"; } catch (e) { timer = e.message; }
        await inner;
        // Nothing is pending now: exactly one timer fits, the next is refused.
        let second = "";
        const fired = new Promise((r) => setTimeout(r, 50));
        try { setTimeout(() => {}, 0); second = "started"; } catch (e) { second = e.message; }
        await fired;
        return {k, outer, timer, second};
    """
    result = await _run(client, scope, f"timer-{smuggler}", code)
    assert result.status == "completed", result.raw_json
    # The smuggled call was taken; the host refused the outer one beyond the cap ([B24]).
    assert result.value == {"k": 1, "outer": msg.b24(1), "timer": B13, "second": B13}, result.value
    assert result.telemetry.call_count == 2, result.raw_json


async def test_a_timer_refused_beside_a_pending_call_throws_b13(client: CellblockClient, scope: Scope) -> None:
    code = """
        const p = tools.callValue("host:core:slow", {});
        let refused = "";
        try { setTimeout(() => { refused = "fired"; }, 0); } catch (e) { refused = e.message; }
        const got = await p;
        const id = await new Promise((r) => { const t = setTimeout(() => r(t), 10); });
        return {refused, got, later: typeof id};
    """
    result = await _run(client, scope, "timer-refused", code)
    assert result.status == "completed", result.raw_json
    assert result.value == {"refused": B13, "got": "slow", "later": "number"}, result.value


async def test_the_reported_program_ends_with_the_refused_timer_error(client: CellblockClient, scope: Scope) -> None:
    # The hostile review's program: its timer is refused while the smuggled call still runs.
    code = """
        let k = 0; const a = {toJSON() { if (k++ < 1) tools.callValue("host:core:slow", {}).catch(() => {}); return {}; }};
        try { await tools.callValue("host:core:slow", a); } catch (e) {}
        await new Promise((r) => setTimeout(r, 1500)); return k;
    """
    result = await _run(client, scope, "timer-reported", code)
    assert (result.status, result.code, result.failure_phase) == ("failed", "internal_error", "bridge"), result.raw_json
    # The error text names the setTimeout call (SPEC §8.10): line 4, inside the Promise executor.
    assert result.error is not None and result.error.startswith(f"Error: {B13}\n    at <anonymous> (cellblock:user.js:4:"), result.error


async def test_a_timer_started_once_the_smuggled_call_settled_fires(client: CellblockClient, scope: Scope) -> None:
    code = """
        let k = 0; let inner = null;
        const a = {toJSON() { if (k++ < 1) inner = tools.callValue("host:core:slow", {}); return {}; }};
        try { await tools.callValue("host:core:slow", a); } catch (e) {}
        const got = await inner;
        const t0 = Date.now();
        await new Promise((r) => setTimeout(r, 1500));
        return {k, got, waited: Date.now() - t0 >= 1400};
    """
    result = await _run(client, scope, "timer-after", code)
    assert result.status == "completed", result.raw_json
    assert result.value == {"k": 1, "got": "slow", "waited": True}, result.value
