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
