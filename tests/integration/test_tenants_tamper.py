"""Guest tampering with built-ins is the guest's own error, never an infrastructure fault (issue 11 item 5).

A program may redefine, poison, freeze or delete any built-in the engine gives it. The cell's
controller captured what it needs before the program ran, so each tampering below ends as the
program's own outcome (SPEC §8.1 item 5): it completes, or fails as an uncaught guest error
(`internal_error`, phase `guest` or `bridge`) or, for a final value nothing can render,
`output_limit_exceeded` [R15]. Never `runtime_unavailable` (a crashed guest agent, R12/R13),
never an invalid cell response (R17), and the service's next exec still works.

Every tampering runs in real cells at top level, just before a park (the run suspends on
`yield_control` and the tampered heap is snapshotted) and right after the resume. Each program
then exercises the controller: console/text/json output, a tool call, a timer, `API.list()` and
its final value (or a thrown value). The table is tests/support/tamperings.py.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from cellblock.client import CellblockClient, LimitOverrides, Scope, Tool
from tests.support.cells import TIME_SCALE
from tests.support.tamperings import CAUGHT_OOM, ENDINGS, PLACES, TAMPERINGS, VALUES, program

pytestmark = pytest.mark.asyncio(loop_scope="session")

TOOLS = [Tool(source="host", owner="core", name="echo")]
# Generous: only a hang may reach the deadline (the programs are tiny; a loaded machine slows them).
LIMITS = LimitOverrides(timeout_ms=int(8000 * TIME_SCALE), memory_limit_bytes=32 * 1024 * 1024)


async def echo(tool_input: dict[str, Any], call: Any) -> dict[str, Any]:
    return {"details": tool_input}


HANDLERS = {"echo": echo}


def _outcome(result: Any) -> str:
    """``completed``, ``waiting``, or ``failed <code> <phase>: <error head>``."""
    if result.status != "failed":
        return str(result.status)
    return f"failed {result.code} {result.failure_phase}: {(result.error or '').splitlines()[0][:120]}"


def _acceptable(result: Any) -> bool:
    """The program's own outcome: completed, or an uncaught guest error / host reply, or R15."""
    if result.status == "completed":
        return True
    if result.status != "failed":
        return False
    if result.code == "output_limit_exceeded":
        return bool(result.error and result.error.startswith("output limit exceeded: the return value could not be serialised"))
    return result.code in ("internal_error", "invalid_input") and result.failure_phase in ("guest", "bridge")


async def _run_to_end(client: CellblockClient, scope: Scope, tool_call_id: str, code: str) -> tuple[Any, list[str]]:
    """Execs code, then waits through every park; returns the last result and each leg's outcome."""
    result = await client.exec(scope, tool_call_id=tool_call_id, code=code, handlers=HANDLERS, limits=LIMITS)
    legs = [_outcome(result)]
    for i in range(3):
        if result.status != "waiting":
            break
        assert result.reason == "yield", result.raw_json
        result = await client.wait(scope, tool_call_id=f"{tool_call_id}-w{i}", run_id=result.run_id, handlers=HANDLERS)
        legs.append(_outcome(result))
    return result, legs


async def _still_serves(client: CellblockClient, scope: Scope) -> None:
    started = time.monotonic()
    result = await client.exec(scope, tool_call_id="after", code="return 40 + 2", handlers={})
    assert result.status == "completed" and result.value == 42, result.raw_json
    assert time.monotonic() - started < 10 * TIME_SCALE


#: The places and endings each tampering runs with in real cells. Together they take every
#: controller path: start, idle status, snapshot and restore, value, error text and the value's
#: fallback (the unit test tests/unit/guest/test_controller_tamper.py runs the full matrix).
COMBINATIONS = (("before a park", "value"), ("after the resume", "throw"), ("top level", "unrenderable value"))


@pytest.mark.parametrize("name", list(TAMPERINGS))
async def test_tampering_is_the_programs_own_outcome(client: CellblockClient, scope: Scope, name: str) -> None:
    await client.put_catalog(scope, TOOLS)
    seen: dict[str, list[str]] = {}
    bad: list[str] = []
    for n, (place, ending) in enumerate(COMBINATIONS):
        result, legs = await _run_to_end(client, scope, f"t-{n}", program(TAMPERINGS[name], place, ENDINGS[ending]))
        seen[f"{place}/{ending}"] = legs
        if not _acceptable(result) or any(leg.startswith("failed") for leg in legs[:-1]):
            bad.append(f"{place}/{ending}: {legs}")
        if ending == "throw" and result.status == "completed":
            bad.append(f"{place}/{ending}: a thrown error completed the run: {legs}")
    print(f"\nTAMPER {name}: {seen}")
    assert not bad, f"{name}: " + "; ".join(bad)
    await _still_serves(client, scope)


@pytest.mark.parametrize("name", list(VALUES))
async def test_hostile_values_are_the_programs_own_outcome(client: CellblockClient, scope: Scope, name: str) -> None:
    await client.put_catalog(scope, TOOLS)
    seen: dict[str, list[str]] = {}
    bad: list[str] = []
    for n, place in enumerate(("top level", "after the resume")):
        code = f"await null;\n{VALUES[name]}" if place == "top level" else program("", place, VALUES[name])
        result, legs = await _run_to_end(client, scope, f"v-{n}", code)
        seen[place] = legs
        if not _acceptable(result):
            bad.append(f"{place}: {legs}")
    print(f"\nVALUE {name}: {seen}")
    assert not bad, f"{name}: " + "; ".join(bad)
    await _still_serves(client, scope)


OOM_MESSAGE = (
    "cell memory exhausted: the program needed more than its 33554432-byte limit. Page through large tool results or keep less data in the cell."
    " Tool calls that already ran were not undone; check them before retrying."
)


@pytest.mark.parametrize("place", PLACES)
async def test_out_of_memory_caught_by_the_guest_is_still_memory_exhaustion(client: CellblockClient, scope: Scope, place: str) -> None:
    # SPEC §10.10 item 1: catching the engine's out-of-memory error and allocating on is still R09.
    await client.put_catalog(scope, TOOLS)
    # The limit, not the clock, must end it (LIMITS' deadline is generous, as in test_hostile.py).
    result, legs = await _run_to_end(client, scope, "oom", program("", place, CAUGHT_OOM))
    assert (result.status, result.code, result.failure_phase) == ("failed", "runtime_unavailable", "host"), legs
    assert result.error == OOM_MESSAGE
    await _still_serves(client, scope)
