"""Host-side second layers and honest classification (issue 11 items 4, 5).

Real service, real cells: the host counts pending tool calls itself, and a cell killed
from outside (exit 137 without the engine's OOMKilled) is [R12], not [R09].
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import docker
import pytest

from cellblock.client import CellblockClient, LimitOverrides, Scope, Tool
from tests.support.cells import leg_cells

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_the_host_counts_pending_tool_calls_a_guest_smuggles_past_its_own_count(client: CellblockClient, scope: Scope) -> None:
    await client.put_catalog(scope, [Tool(source="host", owner="core", name="echo")])
    running = 0
    most = 0

    async def echo(tool_input: Any, call: Any) -> Any:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await asyncio.sleep(0.3)
        running -= 1
        return {"details": "ok"}

    # Serialising the input runs toJSON, which starts another call before the first is counted.
    code = """
        let n = 0; const ps = [];
        const arg = { toJSON() { if (n++ < 40) { ps.push(tools.callValue("host:core:echo", arg).then(() => "ok", (e) => e.message)); } return {k: 1}; } };
        ps.push(tools.callValue("host:core:echo", arg).then(() => "ok", (e) => e.message));
        return await Promise.all(ps);
    """
    result = await client.exec(scope, tool_call_id="smuggle", code=code, handlers={"echo": echo}, limits=LimitOverrides(max_pending_tool_calls=1, timeout_ms=5000))
    assert result.status == "completed", result.raw_json
    assert most <= 1, f"{most} tool calls ran at once with maxPendingToolCalls 1"
    b24 = "too many pending tool calls (limit 1); the host refused this call. Await some before starting more."
    assert set(result.value) == {"ok", b24} and result.value.count("ok") == 1, result.value


async def test_a_cell_killed_from_outside_is_r12_not_out_of_memory(client: CellblockClient, scope: Scope, service: Any, docker_client: docker.DockerClient) -> None:
    await client.put_catalog(scope, [Tool(source="host", owner="core", name="echo")])
    before = set(leg_cells(service))
    leg = asyncio.ensure_future(client.exec(scope, tool_call_id="killed", code="while (true) {}", handlers={}, limits=LimitOverrides(timeout_ms=20000)))
    deadline = time.monotonic() + 30
    mine: list[str] = []
    while not mine and time.monotonic() < deadline:
        await asyncio.sleep(0.3)
        mine = [n for n in leg_cells(service) if n not in before]
    assert mine, "the leg's cell never appeared"
    await asyncio.sleep(1.0)
    docker_client.containers.get(mine[0]).kill()
    result = await asyncio.wait_for(leg, timeout=30)
    assert (result.status, result.code) == ("failed", "runtime_unavailable"), result.raw_json
    assert result.error == "cell runtime unavailable: the cell exited with code 137.", result.error
