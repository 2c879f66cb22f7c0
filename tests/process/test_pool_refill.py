"""When the warm pool refills (DESIGN.md, the warm pool): a take defers it, a miss does not.

A real :class:`WarmPool` over the ``process`` executor: its cells are real guest agents that
attach to real bridges. The deferral is set long (5 s) here, so the two cases differ by
seconds, not by the machine's load.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from cellblock.server.cells import ProcessExecutor, WarmPool

pytestmark = [pytest.mark.asyncio(loop_scope="function"), pytest.mark.timeout(90)]
LIMIT = 256 * 1024 * 1024


@pytest_asyncio.fixture(loop_scope="function")
async def pool() -> AsyncIterator[WarmPool]:
    with tempfile.TemporaryDirectory(prefix="cellblock-pool-") as sockets:
        executor = ProcessExecutor()
        warm = WarmPool(executor, sockets, size=2, memory_limit_bytes=LIMIT)
        warm.refill_defer_s = 5.0
        warm.start()
        try:
            await _ready(warm, 2, 30.0)
            yield warm
        finally:
            await warm.close()
            await executor.close()


async def _ready(pool: WarmPool, cells: int, within_s: float) -> None:
    deadline = time.monotonic() + within_s
    while pool.ready_count < cells:
        assert time.monotonic() < deadline, f"the pool holds {pool.ready_count} ready cells, not {cells}"
        await asyncio.sleep(0.05)


async def _destroy(*taken: object) -> None:
    for warm in taken:
        await warm.destroy()  # type: ignore[attr-defined]


async def test_a_take_defers_the_refill(pool: WarmPool) -> None:
    started = pool._executor.cells_started
    taken = await pool.take(LIMIT)
    assert taken is not None and pool.ready_count == 1
    await asyncio.sleep(1.5)
    assert pool._executor.cells_started == started, "no cell starts while the refill is deferred"
    second = await pool.take(LIMIT)  # empties the pool: still deferred from the first take
    assert second is not None
    await asyncio.sleep(1.0)
    assert pool._executor.cells_started == started
    await _ready(pool, 2, 30.0)  # the deferral ends (5 s after the first take) and the pool refills
    assert pool._executor.cells_started == started + 2
    await _destroy(taken, second)


async def test_a_miss_refills_at_once(pool: WarmPool) -> None:
    started = pool._executor.cells_started
    first, second = await pool.take(LIMIT), await pool.take(LIMIT)
    assert first is not None and second is not None
    assert await pool.take(LIMIT) is None, "the pool is empty: a miss"
    deadline = time.monotonic() + 2.0
    while pool._executor.cells_started == started:
        assert time.monotonic() < deadline, "a miss must start the refill at once, not after the deferral"
        await asyncio.sleep(0.02)
    await _ready(pool, 2, 30.0)
    await _destroy(first, second)
