"""Guest failures to SPEC §11 outcomes, without Docker.

Real QuickJS programs for the failures a program can cause (its own error, an uncaught host
rejection of each provenance, a promise with no host work, a deadline while computing), and
``tests/support/scripted_guest.py`` for the ones it cannot (engine traps, memory exhaustion
reported by the guest, exit codes, an invalid message). The host side under test (the bridge,
the leg, ``_guest_failure``) is the real one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from cellblock.client import CellblockClient, LimitOverrides, Scope, ToolCallInfo, ToolRefused
from cellblock.server import messages as msg
from cellblock.server.app import Service
from cellblock.server.config import Limits
from cellblock.server.limits import WATCHDOG_GRACE_MS

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(60)]

MEMORY = Limits().memory_limit_bytes


async def failing(tool_input: dict[str, Any], call: ToolCallInfo) -> Any:
    raise RuntimeError("the tool broke")


async def refusing(tool_input: dict[str, Any], call: ToolCallInfo) -> Any:
    raise ToolRefused("invalid_input", "bad key")


@pytest.mark.parametrize(
    ("code", "expected_code", "phase", "error"),
    [
        pytest.param('throw new Error("boom");', "internal_error", "guest", "Error: boom", id="guest-error"),
        pytest.param('await tools.callValue("client:app:refuse", {});', "invalid_input", "bridge", "Error: bad key", id="input-provenance-rejection"),
        pytest.param('await tools.callValue("client:app:fail", {});', "internal_error", "bridge", "Error: the tool broke", id="internal-provenance-rejection"),
        pytest.param("await new Promise(() => {});", "internal_error", "guest", msg.R04, id="pending-without-host-work"),
        pytest.param("for (;;) {}", "timeout", "host", msg.r05(1000), id="deadline-while-computing"),
    ],
)
async def test_program_failures(client: CellblockClient, code: str, expected_code: str, phase: str, error: str) -> None:
    scope = Scope(session_id="proc-fail", agent_run_id=f"agent-{abs(hash(code))}")
    await client.put_catalog(scope, [{"source": "client", "owner": "app", "name": "refuse"}, {"source": "client", "owner": "app", "name": "fail"}])
    # A short deadline only where the deadline is the point; the others must end well before theirs.
    timeout_ms = 1000 if expected_code == "timeout" else 10_000
    result = await client.exec(scope, tool_call_id="f", code=code, handlers={"refuse": refusing, "fail": failing}, limits=LimitOverrides(timeout_ms=timeout_ms))
    assert (result.status, result.code, result.failure_phase) == ("failed", expected_code, phase), result.raw_json
    assert result.error is not None and result.error.startswith(error), result.error
    listed = await client.list_runs(scope)
    assert listed.runs == [], "a failed run is removed"


@pytest_asyncio.fixture(loop_scope="module")
async def scripted_client(scripted_service: Service) -> AsyncIterator[CellblockClient]:
    async with await CellblockClient.connect(scripted_service.address) as c:
        yield c


async def test_a_guest_silent_past_its_deadline_is_killed_by_the_hosts_watchdog(scripted_client: CellblockClient) -> None:
    # The leg's settle loop is woken at the deadline and again at the kill time (its two timers):
    # a cell that neither ends nor answers is killed then, and the leg fails with [R06].
    scope = Scope(session_id="proc-scripted", agent_run_id="silent")
    await scripted_client.put_catalog(scope, [{"source": "client", "owner": "app", "name": "noop"}])
    started = time.monotonic()
    result = await scripted_client.exec(scope, tool_call_id="s", code="// SCRIPT:silent\nreturn 1;", handlers={}, limits=LimitOverrides(timeout_ms=1000))
    assert (result.status, result.code, result.failure_phase, result.error) == ("failed", "timeout", "host", msg.r06(1000)), result.raw_json
    assert time.monotonic() - started < 1.0 + WATCHDOG_GRACE_MS / 1000 + 5.0


@pytest.mark.parametrize(
    ("script", "expected_code", "phase", "error"),
    [
        ("fail:GUEST_ERROR", "internal_error", "guest", "scripted guest_error"),
        # A rejection the host never delivered is the guest's own error, not a bridge failure.
        ("fail:BRIDGE_REJECTION", "internal_error", "guest", "scripted bridge_rejection"),
        ("fail:UNSETTLEABLE", "internal_error", "guest", msg.R04),
        ("fail:MEMORY", "runtime_unavailable", "host", msg.r09(MEMORY)),
        ("fail:ENGINE_TRAP", "runtime_unavailable", "host", msg.R10),
        ("fail:INTERRUPTED", "timeout", "host", msg.r05(Limits().timeout_ms)),
        ("fail:SYNTAX", "invalid_input", "input", msg.s02(3, 1, "unexpected token")),
        ("fail:UNSERIALISABLE", "output_limit_exceeded", "host", msg.r15("scripted unserialisable")),
        ("exit:3", "runtime_unavailable", "host", msg.r12(3)),
        # The real agent exits 0 only after sending its end: one the host did not get was refused
        # by the bridge, over the run's bound (SPEC §2.3, §9 rule 6).
        ("exit:0", "output_limit_exceeded", "host", msg.r15(msg.too_large_to_read(Limits().bridge_message_bytes))),
        ("exit:137", "runtime_unavailable", "host", msg.r09(MEMORY)),
        ("exit:124", "timeout", "host", msg.r05(Limits().timeout_ms)),
        ("garbage", "internal_error", "host", msg.R17),
    ],
)
async def test_scripted_guest_failures(scripted_client: CellblockClient, script: str, expected_code: str, phase: str, error: str) -> None:
    scope = Scope(session_id="proc-scripted", agent_run_id=script)
    await scripted_client.put_catalog(scope, [{"source": "client", "owner": "app", "name": "noop"}])
    result = await scripted_client.exec(scope, tool_call_id="s", code=f"// SCRIPT:{script}\nreturn 1;", handlers={})
    assert (result.status, result.code, result.failure_phase, result.error) == ("failed", expected_code, phase, error), result.raw_json
    assert (await scripted_client.list_runs(scope)).runs == [], "a failed run is removed"


@pytest.mark.parametrize(
    ("script", "bridge_id", "error"),
    [
        # A protocol violation is rejected back to the guest at once, not left to the watchdog (SPEC §14.5).
        ("forge:PROTOCOL", "bridge:call:x", msg.p02("bridge:call:x")),
        # An unknown refusal kind is a refusal like any other, not a fault of the service ([R22]).
        ("forge:REFUSAL", "bridge:call:x", msg.p02("bridge:call:x")),
        # Output entries of another shape are dropped and logged, not a fault of the service ([R22]).
        ("forge:OUTPUT", "bridge:call:x", msg.p02("bridge:call:x")),
        # The host counts pending nested calls too: a guest past its own count gets [B24] (SPEC §9).
        ("forge:PENDING", "bridge:callValue:2", msg.b24(1)),
    ],
)
async def test_forged_requests_are_answered_by_the_host(scripted_client: CellblockClient, script: str, bridge_id: str, error: str) -> None:
    scope = Scope(session_id="proc-forged", agent_run_id=script)
    await scripted_client.put_catalog(scope, [{"source": "client", "owner": "app", "name": "noop"}])

    async def never(tool_input: dict[str, Any], call: ToolCallInfo) -> Any:
        await asyncio.sleep(3600)

    result = await scripted_client.exec(
        scope, tool_call_id="forged", code=f"// SCRIPT:{script}\nreturn 1;", handlers={"noop": never}, limits=LimitOverrides(max_pending_tool_calls=1)
    )
    assert (result.status, result.value) == ("completed", {"bridgeId": bridge_id, "error": error}), result.raw_json
    assert result.output == [], result.raw_json
    assert (await scripted_client.list_runs(scope)).runs == [], "a completed run is removed"
