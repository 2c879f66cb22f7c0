"""A CPU worker does not keep the memory of a tenant's large call (issue 11).

Real worker processes (``pebble``, ``spawn``). A worker that parsed 16 MB and 33 MB schemas
stayed at 708 MiB RSS once the catalogs were gone (baseline about 150): the freed heap sat
below live blocks, where glibc never returns it unasked.
"""

from __future__ import annotations

import asyncio
import gc
import json
import weakref
from collections.abc import Iterator

import pytest

from cellblock.server.memory import resident_bytes
from cellblock.server.workers import WORKER_RSS_LIMIT_BYTES, CpuPool

LARGE = 10**6  # characters: the large lane
MIB = 1 << 20

pytestmark = pytest.mark.asyncio(loop_scope="session")

#: What a worker keeps between calls (a cache entry, an interned name): here, live blocks above freed ones.
_KEPT: list[object] = []


def churn(properties: int) -> int:
    """Parses a schema of ``properties`` properties (about 75 bytes each) and keeps one small block allocated mid-way."""
    text = json.dumps({"properties": {f"p{i}": {"type": "string", "description": "x" * 20} for i in range(properties)}})
    parsed = json.loads(text)
    _KEPT.append(f"kept {len(_KEPT)}")  # allocated above the parsed schema: the heap's top cannot shrink past it
    more = json.loads(text)
    return len(parsed["properties"]) + len(more["properties"])


class Decoded(dict[str, int]):
    """A call's result the service process can watch go (a ``dict`` subclass takes weak references)."""


def decode(n: int) -> Decoded:
    """A large call's result, as a registration's decoded catalog."""
    return Decoded(n=n)


def hold(mib: int) -> int:
    """Keeps ``mib`` MiB alive in the worker (a leak the trim cannot give back)."""
    _KEPT.append(b"x" * (mib * MIB))
    return mib


@pytest.fixture
def pool(monkeypatch: pytest.MonkeyPatch) -> Iterator[CpuPool]:
    monkeypatch.setenv("PYTHONMALLOC", "malloc")  # as the service runs (memory.use_system_allocator); workers inherit it
    one = CpuPool(1)
    yield one
    one.close()


async def test_a_workers_rss_returns_near_its_baseline_after_a_large_call(pool: CpuPool) -> None:
    baseline = await pool.run(resident_bytes, budget_s=60, size=LARGE)
    assert await pool.run(churn, 400_000, budget_s=60, size=LARGE) == 800_000  # about 30 MB of JSON, parsed twice
    after = await pool.run(resident_bytes, budget_s=60, size=LARGE)
    # Without the trim the worker kept about 300 MiB.
    assert after - baseline < 60 * MIB, (baseline // MIB, after // MIB)


async def test_a_worker_that_keeps_too_much_is_replaced_after_its_call(pool: CpuPool) -> None:
    baseline = await pool.run(resident_bytes, budget_s=60, size=LARGE)
    assert await pool.run(hold, (WORKER_RSS_LIMIT_BYTES // MIB) + 20, budget_s=60, size=LARGE) > 0  # the call itself completes
    after = await pool.run(resident_bytes, budget_s=60, size=LARGE)  # runs on a fresh worker
    assert after - baseline < 60 * MIB, (baseline // MIB, after // MIB)


async def test_the_service_process_lets_go_of_a_large_calls_arguments_and_result(pool: CpuPool) -> None:
    result = await pool.run(decode, 7, budget_s=60, size=LARGE)
    assert result == {"n": 7}
    gone = weakref.ref(result)
    del result
    for _ in range(50):  # the no-op call that follows it reaches pebble's scheduler thread
        gc.collect()
        if gone() is None:
            break
        await asyncio.sleep(0.02)
    # pebble's scheduler thread kept the last call (its arguments and result) until the next one.
    assert gone() is None
