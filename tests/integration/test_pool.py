"""The warm pool: ready cells make short budgets usable and stay single-use."""

from __future__ import annotations

import asyncio

import pytest

from cellblock.client import CellblockClient, LimitOverrides, Scope, Tool
from cellblock.server.app import Service

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def _pool_ready(service: Service) -> None:
    assert service.pool is not None
    for _ in range(100):
        if len(service.pool._ready) >= 1:
            return
        await asyncio.sleep(0.1)
    raise AssertionError("the warm pool never filled")


async def test_a_short_budget_runs_in_a_warm_cell(client: CellblockClient, scope: Scope, service: Service) -> None:
    await client.put_catalog(scope, [Tool(source="host", name="noop")])
    await _pool_ready(service)
    assert service.pool is not None
    hits = service.pool.hits
    result = await client.exec(scope, tool_call_id="short", code="return 6 * 7", handlers={}, limits=LimitOverrides(timeout_ms=400))
    assert result.status == "completed" and result.value == 42, result.raw_json
    assert service.pool.hits == hits + 1


async def test_warm_cells_serve_one_leg_each(client: CellblockClient, scope: Scope, service: Service) -> None:
    await client.put_catalog(scope, [Tool(source="host", name="noop")])
    await _pool_ready(service)
    first = await client.exec(scope, tool_call_id="p1", code="globalThis.mark = 'left behind'; return 1", handlers={})
    second = await client.exec(scope, tool_call_id="p2", code="return typeof globalThis.mark", handlers={})
    assert first.metadata.cell_id != second.metadata.cell_id
    assert second.value == "undefined", "a cell must never carry state into another leg"


async def test_other_memory_limits_start_fresh_cells(client: CellblockClient, scope: Scope, service: Service) -> None:
    await client.put_catalog(scope, [Tool(source="host", name="noop")])
    assert service.pool is not None
    misses = service.pool.misses
    hits = service.pool.hits
    result = await client.exec(scope, tool_call_id="big", code="return 1", handlers={}, limits=LimitOverrides(memory_limit_bytes=128 * 1024 * 1024))
    assert result.status == "completed"
    assert (service.pool.hits, service.pool.misses) == (hits, misses), "a differently sized leg never takes a pooled cell"


async def test_a_resume_takes_a_pooled_cell(client: CellblockClient, scope: Scope, service: Service) -> None:
    await client.put_catalog(scope, [Tool(source="host", name="noop")])
    first = await client.exec(scope, tool_call_id="y1", code="const y = await yield_control('x'); return y.status", handlers={})
    assert first.status == "waiting", first.raw_json
    await _pool_ready(service)
    assert service.pool is not None
    hits = service.pool.hits
    done = await client.wait(scope, tool_call_id="y1-wait", run_id=first.run_id)
    assert done.status == "completed" and done.value == "yielded", done.raw_json
    assert service.pool.hits == hits + 1, "the resume leg must run in a pooled cell"


async def test_the_pool_grows_with_the_leg_rate_and_stays_bounded(client: CellblockClient, scope: Scope, service: Service) -> None:
    await client.put_catalog(scope, [Tool(source="host", name="noop")])
    pool = service.pool
    assert pool is not None
    assert pool.max_size == 16, "bounded by CELLBLOCK_MAX_CONCURRENT_LEGS"
    taken = pool.hits + pool.misses
    burst = asyncio.gather(*(client.exec(scope, tool_call_id=f"burst{i}", code="return 1", handlers={}, limits=LimitOverrides(timeout_ms=30000)) for i in range(12)))
    for _ in range(200):
        if pool.hits + pool.misses >= taken + 12:
            break
        await asyncio.sleep(0.05)
    # Twelve legs within one refill time ask for twelve ready cells.
    assert pool.target_size() >= 12
    assert all(r.status == "completed" for r in await burst)
    for _ in range(20):
        taken_cell = pool.acquire(pool.memory_limit_bytes)  # a hit or a miss; either counts as a leg
        if taken_cell is not None:
            await taken_cell.destroy()
    assert pool.target_size() == pool.max_size, "never above CELLBLOCK_MAX_CONCURRENT_LEGS"


async def test_a_cell_is_removed_right_after_the_reply(client: CellblockClient, scope: Scope, service: Service) -> None:
    from cellblock.server.cells import DockerExecutor

    await client.put_catalog(scope, [Tool(source="host", name="noop")])
    result = await client.exec(scope, tool_call_id="reap", code="return 1", handlers={})
    executor = service.executor
    assert isinstance(executor, DockerExecutor)
    name = f"cellblock-{result.metadata.cell_id}"
    # The reply does not wait for the container's removal; the reaper does it.
    await executor.reaper.drain()
    assert name not in executor.list_cell_containers()
    assert result.metadata.cell_id not in executor.reaper.retiring


async def test_a_warm_cell_has_a_legs_cpu_weight_once_ready_and_is_still_vouched_for(service: Service) -> None:
    """A pooled cell starts at CPU weight 2 and is given 1024 before any leg can take it; that update costs no engine call at the take."""
    import docker

    from cellblock.server.cells._docker import DockerCell

    await _pool_ready(service)
    assert service.pool is not None
    engine = docker.from_env()
    try:
        for warm in list(service.pool._ready):
            assert isinstance(warm.cell, DockerCell)
            info = engine.api.inspect_container(warm.cell.runtime_id)
            assert info["HostConfig"]["CpuShares"] == 1024, "a ready cell runs at a leg's weight"
            assert service.executor.events.vouches_for(warm.cell.cell_id, warm.cell._events_generation), "the weight's update event is benign"
    finally:
        engine.close()
