"""Waiting for a cell is bounded on its own; the program's budget is the program's (issue 11 items 6, 9).

Real services with real Docker cells: short ``timeoutMs`` programs complete under cell
start latency, an exceeded cell wait is [R21] and leaks no container, and a paused
pooled cell is never handed to a leg.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import AsyncIterator
from typing import Any

import docker
import pytest
import pytest_asyncio

from cellblock.client import CellblockClient, LimitOverrides, Scope, Tool
from cellblock.server.app import ServerSettings, Service, start_service
from tests.integration.conftest import IMAGE
from tests.support.cells import cell_dirs, state_dir_in

pytestmark = pytest.mark.asyncio(loop_scope="session")


@pytest_asyncio.fixture(loop_scope="session")
async def make_service(docker_client: Any) -> AsyncIterator[Any]:
    started: list[tuple[Service, str]] = []
    temps: list[tempfile.TemporaryDirectory[str]] = []

    async def make(**kw: Any) -> Service:
        temp = tempfile.TemporaryDirectory(prefix="cellblock-cells-")
        temps.append(temp)
        svc = await start_service(ServerSettings(address="127.0.0.1:0", image=IMAGE, code_mode={"enabled": True}, socket_dir=temp.name, state_dir=state_dir_in(temp.name), **kw))
        started.append((svc, temp.name))
        return svc

    yield make
    for svc, sockets in started:
        await svc.stop()
        await asyncio.sleep(0.5)
        assert svc.executor.list_cell_containers() == []  # type: ignore[attr-defined]
        assert cell_dirs(sockets) == []
    for temp in temps:
        temp.cleanup()


async def test_a_short_budget_is_spent_on_the_program_not_on_starting_its_cell(make_service: Any) -> None:
    svc = await make_service(warm_pool=0)
    async with await CellblockClient.connect(svc.address) as client:
        scope = Scope("budget", "budget")
        await client.put_catalog(scope, [Tool(source="host", name="noop")])
        code = "await new Promise(r => setTimeout(r, 20)); return 7;"
        started = time.monotonic()
        results = await asyncio.gather(*(client.exec(scope, tool_call_id=f"b{i}", code=code, handlers={}, limits=LimitOverrides(timeout_ms=1000)) for i in range(6)))
        elapsed = time.monotonic() - started
    # Six fresh cells on two cores take over a second to start; none of that is the program's.
    assert elapsed > 1.0
    assert [(r.status, r.value) for r in results] == [("completed", 7)] * 6, [r.raw_json for r in results]


async def test_an_exceeded_cell_wait_is_busy_and_leaks_no_cell(make_service: Any) -> None:
    svc = await make_service(warm_pool=0, cell_wait_ms=100)
    async with await CellblockClient.connect(svc.address) as client:
        scope = Scope("busy", "busy")
        await client.put_catalog(scope, [Tool(source="host", name="noop")])
        results = await asyncio.gather(*(client.exec(scope, tool_call_id=f"w{i}", code="return 1", handlers={}) for i in range(3)))
    busy = [r for r in results if r.status == "failed"]
    assert busy, [r.raw_json for r in results]
    for r in busy:
        assert (r.code, r.failure_phase, r.bridge_dispatch_started) == ("runtime_unavailable", "host", False), r.raw_json
        assert r.error == "cell runtime unavailable: the service is busy and no cell was ready within 100 ms; the program did not run. Try again shortly."
    # Cells whose start finished after their leg gave up are removed.
    deadline = time.monotonic() + 20
    while svc.executor.list_cell_containers() and time.monotonic() < deadline:  # type: ignore[attr-defined]
        await asyncio.sleep(0.3)
    assert svc.executor.list_cell_containers() == []  # type: ignore[attr-defined]


async def test_a_paused_pooled_cell_is_never_handed_out(make_service: Any, docker_client: docker.DockerClient) -> None:
    svc = await make_service(warm_pool=1)
    assert svc.pool is not None
    deadline = time.monotonic() + 60
    while not svc.pool.idle_container_names() and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    while time.monotonic() < deadline:
        names = svc.pool.idle_container_names()
        containers = [docker_client.containers.get(n) for n in names]
        if containers and all(c.status == "running" for c in containers) and svc.pool._ready:  # noqa: SLF001 - wait for "ready", not "starting"
            break
        await asyncio.sleep(0.2)
    paused = [docker_client.containers.get(n) for n in svc.pool.idle_container_names()]
    for container in paused:
        container.pause()
    async with await CellblockClient.connect(svc.address) as client:
        scope = Scope("paused", "paused")
        await client.put_catalog(scope, [Tool(source="host", name="noop")])
        started = time.monotonic()
        result = await client.exec(scope, tool_call_id="p", code="return 'fresh'", handlers={}, limits=LimitOverrides(timeout_ms=3000))
        elapsed = time.monotonic() - started
    assert (result.status, result.value) == ("completed", "fresh"), result.raw_json
    assert result.metadata.cell_id not in {c.name.removeprefix("cellblock-") for c in paused}
    assert elapsed < 10, elapsed  # before: the paused cell was used and the exec waited out the attach bound
