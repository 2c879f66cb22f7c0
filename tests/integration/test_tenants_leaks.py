"""Every path out of a leg releases what it holds (issue 11 item 3).

A fault is injected at each step of a leg in the real service (real Docker cells, the
session's service): source preparation, the bridge socket, the cell start, attaching,
dispatching a nested call, projecting the final value, suspending. After each, the
counts that other tenants share are back at their baseline: runs in the registry's cache,
leases, slot reservations in flight, the run store's slots and suspended runs, admission
permits, active legs, leg cells and socket directories; and the service still serves.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest

from cellblock.client import CellblockClient, LimitOverrides, Scope, Tool
from cellblock.server.api._stream_ports import StreamPorts
from cellblock.server.cells import CellBridge, DockerExecutor
from cellblock.server.runs._leg import Leg
from cellblock.server.runs._output import OutputBudget
from cellblock.server.runs._registry import RunRegistry
from cellblock.server.workers import CpuPool
from tests.support.cells import cell_dirs, leg_cells

pytestmark = pytest.mark.asyncio(loop_scope="session")


class InjectedFault(Exception):  # noqa: N818 - the injected failure
    """The failure a test injects."""


def _boom(*_args: Any, **_kwargs: Any) -> Any:
    raise InjectedFault("injected")


async def _aboom(*_args: Any, **_kwargs: Any) -> Any:
    raise InjectedFault("injected")


async def _oserror(*_args: Any, **_kwargs: Any) -> Any:
    raise OSError("injected")


# (step, target, attribute, replacement, program)
TOOL_PROGRAM = 'return await tools.callValue("host:core:echo", {a: 1});'
STEPS: list[tuple[str, Any, str, Callable[..., Any], str]] = [
    ("source preparation", CpuPool, "run", _aboom, "return 1"),
    ("bridge socket", CellBridge, "open", _oserror, "return 1"),
    ("cell start", DockerExecutor, "start", _aboom, "return 1"),
    ("attach", Leg, "_attach_and_drive", _aboom, "return 1"),
    ("dispatch", StreamPorts, "dispatch", _boom, TOOL_PROGRAM),
    ("final value", OutputBudget, "final_value", _boom, TOOL_PROGRAM),
    ("suspension", RunRegistry, "park", _boom, "yield_control('now'); return 1"),
]


async def _counts(service: Any, socket_dir: str) -> dict[str, Any]:
    registry = service.registry
    slots, suspended = await registry.store.counts()
    return {
        "runs": len(registry.active),
        "leases": len(registry._leases),
        "reserving": len(registry._reserving),
        "store_slots": slots,
        "store_suspended": suspended,
        "admission": service.state.admission.running,
        "active_legs": len(service.state.active_legs),
        "leg_cells": len(leg_cells(service)),
        "cell_dirs": len(cell_dirs(socket_dir)) - (len(service.pool.idle_container_names()) if service.pool is not None else 0),
    }


async def _settled(service: Any, socket_dir: str, baseline: dict[str, Any]) -> dict[str, Any]:
    deadline = time.monotonic() + 20
    while True:
        now = await _counts(service, socket_dir)
        if now == baseline or time.monotonic() > deadline:
            return now
        await asyncio.sleep(0.2)


#: A memory limit the warm pool does not hold, so every leg starts its own cell through each step.
FRESH_CELL = LimitOverrides(timeout_ms=5000, memory_limit_bytes=48 * 1024 * 1024)


async def echo(tool_input: Any, call: Any) -> Any:
    return {"details": tool_input}


@pytest.mark.parametrize("step", [s[0] for s in STEPS])
async def test_a_fault_at_each_step_releases_everything(client: CellblockClient, scope: Scope, service: Any, socket_dir: str, monkeypatch: pytest.MonkeyPatch, step: str) -> None:
    _, target, attribute, replacement, program = next(s for s in STEPS if s[0] == step)
    await client.put_catalog(scope, [Tool(source="host", owner="core", name="echo")])
    # Earlier tests' cells may still be in the reaper's hands: the baseline is taken once they are gone.
    await service.executor.reaper.drain()
    baseline = await _settled(service, socket_dir, await _counts(service, socket_dir))
    with monkeypatch.context() as patch:
        patch.setattr(target, attribute, replacement)
        result = await asyncio.wait_for(client.exec(scope, tool_call_id=f"fault-{step}", code=program, handlers={"echo": echo}, limits=FRESH_CELL), timeout=60)
    assert result.status == "failed", result.raw_json
    assert result.code in ("internal_error", "runtime_unavailable", "invalid_input"), result.raw_json
    assert "Traceback" not in result.error and "InjectedFault" not in result.error, result.error
    assert await _settled(service, socket_dir, baseline) == baseline
    again = await client.exec(scope, tool_call_id=f"after-{step}", code=TOOL_PROGRAM, handlers={"echo": echo})
    assert (again.status, again.value) == ("completed", {"a": 1}), again.raw_json
    assert await _settled(service, socket_dir, baseline) == baseline
