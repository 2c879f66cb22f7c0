"""Cell reuse within a scope (SPEC §16.2) with real Docker cells.

Under ``CELLBLOCK_CELL_REUSE=scope`` consecutive legs of one scope run in one
container, each in a fresh VM with its own token; every destruction rule of
§16.2 item 2 removes the container instead. Under ``leg`` (the default, the
session's ``service`` fixture) no container serves two legs.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import tempfile
from collections.abc import AsyncIterator
from typing import Any

import docker
import pytest
import pytest_asyncio

from cellblock.client import CellblockClient, LimitOverrides, RunResult, Scope, Tool
from cellblock.server.app import ServerSettings, Service, start_service
from tests.support.cells import IMAGE, OCI_RUNTIME, TIME_SCALE, cell_dirs, state_dir_in

pytestmark = pytest.mark.asyncio(loop_scope="session")

MAX_LEGS = 3
IDLE_S = 2.0
_ids = itertools.count(1)


async def _reuse_service(socket_dir: str, **overrides: Any) -> Service:
    options: dict[str, Any] = {"cell_max_legs": MAX_LEGS, "cell_idle_s": IDLE_S, **overrides}
    settings = ServerSettings(
        address="127.0.0.1:0", executor="docker", image=IMAGE, oci_runtime=OCI_RUNTIME, warm_pool=1, code_mode={"enabled": True, "timeoutMs": 8000},
        socket_dir=socket_dir, state_dir=state_dir_in(socket_dir), store="memory:", cell_reuse="scope", **options,
    )
    return await start_service(settings)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def reuse(docker_client: docker.DockerClient) -> AsyncIterator[Service]:
    """A service with ``CELLBLOCK_CELL_REUSE=scope`` (3 legs per cell, 2 s idle)."""
    with tempfile.TemporaryDirectory(prefix="cellblock-test-reuse-") as sockets:
        service = await _reuse_service(sockets)
        yield service
        await service.stop()
        assert service.executor.list_cell_containers() == []  # type: ignore[attr-defined]
        assert cell_dirs(sockets) == []


@pytest_asyncio.fixture(loop_scope="session")
async def rclient(reuse: Service) -> AsyncIterator[CellblockClient]:
    async with await CellblockClient.connect(reuse.address) as c:
        yield c


async def _scope(client: CellblockClient) -> Scope:
    n = next(_ids)
    scope = Scope(session_id=f"reuse-{os.getpid()}-{n}", agent_run_id=f"agent-{n}")
    await client.put_catalog(scope, [Tool(source="host", name="echo")])
    return scope


async def _exec(client: CellblockClient, scope: Scope, code: str, **kw: Any) -> RunResult:
    return await client.exec(scope, tool_call_id=f"t{next(_ids)}", code=code, handlers=kw.pop("handlers", {}), **kw)


def _container_id(docker_client: docker.DockerClient, cell_id: str) -> str:
    return str(docker_client.containers.get(f"cellblock-{cell_id}").id)


async def _gone(docker_client: docker.DockerClient, cell_id: str) -> None:
    for _ in range(int(150 * TIME_SCALE)):
        # Sparse: a full listing inspects each container, which raises NotFound for one removed meanwhile.
        if not docker_client.containers.list(all=True, sparse=True, filters={"name": f"cellblock-{cell_id}"}):
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"the container of {cell_id} was not destroyed")


def _idle(service: Service) -> set[str]:
    assert service.state.scope_cells is not None
    return set(service.state.scope_cells.idle_cell_ids())


async def _kept_cell(client: CellblockClient, scope: Scope, service: Service, **kw: Any) -> str:
    first = await _exec(client, scope, "return 1", **kw)
    assert first.status == "completed", first.raw_json
    # The leg's cell is kept before its result is sent.
    assert first.metadata.cell_id in _idle(service)
    return first.metadata.cell_id


async def _destroyed(service: Service, docker_client: docker.DockerClient, cell: str) -> None:
    """The cell was not kept when its leg ended (well before its idle limit), and its container goes."""
    assert cell not in _idle(service)
    await _gone(docker_client, cell)


async def test_two_legs_of_one_scope_share_the_container_and_nothing_else(rclient: CellblockClient, docker_client: docker.DockerClient) -> None:
    scope = await _scope(rclient)
    probe = "[typeof secret, typeof Object.prototype.polluted, typeof std, typeof os, typeof require, typeof Deno]"
    first = await _exec(rclient, scope, f"globalThis.secret = 'leg one'; Object.prototype.polluted = 1; setTimeout(() => text('late'), 50); text('from leg one'); return {probe};")
    assert first.status == "completed" and first.value == ["string", "number", "undefined", "undefined", "undefined", "undefined"], first.raw_json
    container = _container_id(docker_client, first.metadata.cell_id)
    second = await _exec(rclient, scope, f"return {probe};")
    assert second.status == "completed", second.raw_json
    assert second.metadata.cell_id == first.metadata.cell_id and _container_id(docker_client, second.metadata.cell_id) == container
    # A fresh VM: no global, no prototype change, no timer or output of leg one; and no file API in either.
    assert second.value == ["undefined"] * 6
    assert second.output == []


async def test_a_parked_run_resumes_in_the_scopes_cell(rclient: CellblockClient) -> None:
    scope = await _scope(rclient)
    parked = await _exec(rclient, scope, "globalThis.mark = 'run state'; const v = await yield_control('p'); return typeof mark;")
    assert parked.status == "waiting", parked.raw_json
    done = await rclient.wait(scope, tool_call_id="w", run_id=parked.run_id)
    # The run's own heap comes back from its snapshot, in the scope's cell.
    assert done.status == "completed" and done.value == "string" and done.metadata.cell_id == parked.metadata.cell_id, done.raw_json
    fresh = await _exec(rclient, scope, "return typeof globalThis.mark")
    assert fresh.value == "undefined" and fresh.metadata.cell_id == parked.metadata.cell_id


async def test_a_guest_error_keeps_the_cell(rclient: CellblockClient, reuse: Service) -> None:
    scope = await _scope(rclient)
    cell = await _kept_cell(rclient, scope, reuse)
    failed = await _exec(rclient, scope, "throw new Error('the program failed')")
    assert failed.status == "failed" and failed.metadata.cell_id == cell, failed.raw_json
    assert cell in _idle(reuse)
    after = await _exec(rclient, scope, "return 2")
    assert after.value == 2 and after.metadata.cell_id == cell


async def test_another_scope_never_gets_the_cell(rclient: CellblockClient, reuse: Service) -> None:
    a, b = await _scope(rclient), await _scope(rclient)
    cell_a = await _kept_cell(rclient, a, reuse)
    in_b = await _exec(rclient, b, "return 1")
    assert in_b.metadata.cell_id != cell_a
    again = await _exec(rclient, a, "return 1")
    assert again.metadata.cell_id == cell_a


async def test_a_timed_out_leg_destroys_its_cell(rclient: CellblockClient, reuse: Service, docker_client: docker.DockerClient) -> None:
    scope = await _scope(rclient)
    cell = await _kept_cell(rclient, scope, reuse)
    result = await _exec(rclient, scope, "while (true) {}", limits=LimitOverrides(timeout_ms=500))
    assert (result.status, result.code, result.metadata.cell_id) == ("failed", "timeout", cell), result.raw_json
    await _destroyed(reuse, docker_client, cell)
    assert (await _exec(rclient, scope, "return 1")).metadata.cell_id != cell


async def test_an_aborted_leg_destroys_its_cell(rclient: CellblockClient, reuse: Service, docker_client: docker.DockerClient) -> None:
    scope = await _scope(rclient)
    cell = await _kept_cell(rclient, scope, reuse)
    called = asyncio.Event()

    async def hang(tool_input: dict[str, Any], call: Any) -> dict[str, Any]:
        called.set()
        await asyncio.sleep(3600)
        return {}

    task = asyncio.ensure_future(_exec(rclient, scope, "return await tools.echo({})", handlers={"echo": hang}))
    await asyncio.wait_for(called.wait(), timeout=30)
    task.cancel()
    for _ in range(50):  # the abort reaches the leg after the stream's cancellation
        if not reuse.state.active_legs:
            break
        await asyncio.sleep(0.05)
    await _destroyed(reuse, docker_client, cell)
    assert (await _exec(rclient, scope, "return 1")).metadata.cell_id != cell


async def test_memory_exhaustion_destroys_the_cell(rclient: CellblockClient, reuse: Service, docker_client: docker.DockerClient) -> None:
    scope = await _scope(rclient)
    small = LimitOverrides(memory_limit_bytes=32 * 1024 * 1024)
    cell = await _kept_cell(rclient, scope, reuse, limits=small)
    result = await _exec(rclient, scope, "const a = []; for (;;) a.push('x'.repeat(1 << 20));", limits=small)
    assert (result.status, result.code, result.metadata.cell_id) == ("failed", "runtime_unavailable", cell), result.raw_json
    await _destroyed(reuse, docker_client, cell)


async def test_an_engine_trap_destroys_the_cell(rclient: CellblockClient, reuse: Service, docker_client: docker.DockerClient) -> None:
    scope = await _scope(rclient)
    cell = await _kept_cell(rclient, scope, reuse)
    result = await _exec(rclient, scope, "function f(n) { return f(n + 1) + 1; } return f(0);")
    assert (result.status, result.code, result.metadata.cell_id) == ("failed", "runtime_unavailable", cell), result.raw_json
    assert result.error.startswith("cell engine stopped")
    await _destroyed(reuse, docker_client, cell)


async def test_the_end_of_the_scope_destroys_its_cells(rclient: CellblockClient, reuse: Service, docker_client: docker.DockerClient) -> None:
    scope = await _scope(rclient)
    cell = await _kept_cell(rclient, scope, reuse)
    await rclient.delete_catalog(scope)
    await _destroyed(reuse, docker_client, cell)
    await rclient.put_catalog(scope, [Tool(source="host", name="echo")])
    assert (await _exec(rclient, scope, "return 1")).metadata.cell_id != cell


async def test_a_cell_serves_at_most_max_legs(rclient: CellblockClient, reuse: Service, docker_client: docker.DockerClient) -> None:
    scope = await _scope(rclient)
    cells = [(await _exec(rclient, scope, "return 1")).metadata.cell_id for _ in range(MAX_LEGS + 1)]
    assert len(set(cells[:MAX_LEGS])) == 1 and cells[MAX_LEGS] != cells[0], cells
    await _destroyed(reuse, docker_client, cells[0])


async def test_an_idle_cell_is_destroyed(rclient: CellblockClient, reuse: Service, docker_client: docker.DockerClient) -> None:
    scope = await _scope(rclient)
    cell = await _kept_cell(rclient, scope, reuse)
    await asyncio.sleep(IDLE_S + 0.5)
    await _destroyed(reuse, docker_client, cell)
    assert (await _exec(rclient, scope, "return 1")).metadata.cell_id != cell


async def test_a_cell_older_than_max_age_is_destroyed(docker_client: docker.DockerClient) -> None:
    with tempfile.TemporaryDirectory(prefix="cellblock-test-reuse-age-") as sockets:
        service = await _reuse_service(sockets, cell_max_age_s=1.5, cell_idle_s=30.0)
        try:
            async with await CellblockClient.connect(service.address) as client:
                scope = await _scope(client)
                cell = await _kept_cell(client, scope, service)
                await asyncio.sleep(1.6)
                assert (await _exec(client, scope, "return 1")).metadata.cell_id != cell
                await _destroyed(service, docker_client, cell)
        finally:
            await service.stop()


async def test_the_leg_default_never_reuses_a_cell(client: CellblockClient, scope: Scope, service: Service) -> None:
    assert service.state.scope_cells is None
    await client.put_catalog(scope, [Tool(source="host", name="echo")])
    cells = {(await _exec(client, scope, "return 1")).metadata.cell_id for _ in range(3)}
    assert len(cells) == 3


async def test_a_cell_kept_from_a_run_with_smaller_bridge_limits_is_not_handed_a_larger_run(rclient: CellblockClient, reuse: Service) -> None:
    # A fresh cell's bridge reads no message over its first run's bound (SPEC §2.3): output and snapshot
    # limits of 1 KiB give about 1 MiB. The scope's next leg, with default limits, may send a 3 MiB tool
    # input; handed that cell, its stream was cut and the leg ended runtime_unavailable (exit 1).
    scope = await _scope(rclient)
    memory = 32 * 1024 * 1024  # not the warm pool's size: the first leg starts its own cell
    small = LimitOverrides(memory_limit_bytes=memory, max_output_bytes=1024, max_snapshot_bytes=1024)
    cell = await _kept_cell(rclient, scope, reuse, limits=small)

    async def echo(tool_input: dict[str, Any], call: Any) -> dict[str, Any]:
        return {"details": len(tool_input["s"])}

    code = "return await tools.echo({s: 'y'.repeat(3 * 1024 * 1024)})"
    big = await _exec(rclient, scope, code, handlers={"echo": echo}, limits=LimitOverrides(memory_limit_bytes=memory))
    assert (big.status, big.value) == ("completed", 3 * 1024 * 1024), big.raw_json
    assert big.metadata.cell_id != cell


async def test_a_kept_cell_paused_while_idle_is_never_handed_out(rclient: CellblockClient, reuse: Service, docker_client: docker.DockerClient) -> None:
    scope = await _scope(rclient)
    cell = await _kept_cell(rclient, scope, reuse)
    docker_client.containers.get(f"cellblock-{cell}").pause()
    second = await _exec(rclient, scope, "return 'fresh'", limits=LimitOverrides(timeout_ms=3000))
    assert (second.status, second.value) == ("completed", "fresh"), second.raw_json
    assert second.metadata.cell_id != cell
    await _destroyed(reuse, docker_client, cell)
