"""Counting the loop turns another task gets while a step runs (a step that yields the loop lets it run)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator


class Turns:
    """The turns another task had while the ``with`` block of :func:`other_tenant_turns` ran."""

    count = 0


@contextlib.asynccontextmanager
async def other_tenant_turns() -> AsyncIterator[Turns]:
    """Runs another task that counts its loop turns while the block runs; yields the count (read it after the block)."""
    turns = Turns()
    ticks = 0

    async def other_tenant() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    other = asyncio.ensure_future(other_tenant())
    await asyncio.sleep(0)
    start = ticks
    try:
        yield turns
    finally:
        turns.count = ticks - start
        other.cancel()
