"""Repro for issue 11's retained-memory finding: RSS of the service and its CPU workers after large catalogs are deleted.

A real service process (``python -m cellblock.server``): registers three catalogs of about
16 MB and one of about 33 MB (host tools with large schemas), deletes them, waits idle and
prints the RSS of the service process and each worker process (MiB) at start, after the
registrations and after the idle wait. Run: ``python -m bench.catalog_memory``
(``BENCH_IDLE_S``: seconds idle, default 120).

Measured (60 s idle, a loaded 2-core machine): before, the service 131 -> 560 MiB and its
worker at 776 MiB; with the workers' trim, retirement and ``_let_go``, 131 -> 132 MiB and a
fresh 24 MiB worker.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from typing import Any

from bench.noisy_neighbour import Service, _ready, process_tree, rss_mib
from cellblock.client import CellblockClient, CellblockError, Scope, Tool

IDLE_S = float(os.environ.get("BENCH_IDLE_S", "120"))


def _schema(properties: int) -> dict[str, Any]:
    return {"type": "object", "properties": {f"p{i}": {"type": "string", "description": "x" * 20, "minLength": 1} for i in range(properties)}}


def _each() -> list[int]:
    return [round(rss_mib(p)) for p in process_tree(service.proc.pid)] if service.proc else []


service = Service("catalog memory", {})


async def main() -> None:
    """Runs the repro and prints its numbers."""
    with tempfile.TemporaryDirectory() as sockets:
        service.start(sockets)
        assert service.proc is not None
        try:
            await _ready(service.address, service.proc)
            await asyncio.sleep(3)
            print(f"start: {_each()} MiB (service first, then its workers)")
            async with await CellblockClient.connect(service.address) as client:
                sizes = (215_000, 215_000, 215_000, 440_000)  # about 16, 16, 16 and 33 MB of schema
                for n, properties in enumerate(sizes):
                    started = time.monotonic()
                    tools = [Tool(source="host", owner="core", name="wide", parameters=_schema(properties))]
                    try:
                        await client.put_catalog(Scope(session_id=f"mem{n}", agent_run_id="run"), tools)
                        outcome = "registered"
                    except CellblockError as exc:  # on a loaded machine the 33 MB one can overrun its budget [C01]
                        outcome = f"refused ({str(exc)[:60]})"
                    print(f"{outcome} {properties} properties in {time.monotonic() - started:.1f} s: {_each()} MiB")
                for n in range(len(sizes)):
                    await client.delete_catalog(Scope(session_id=f"mem{n}", agent_run_id="run"))
            print(f"deleted: {_each()} MiB")
            await asyncio.sleep(IDLE_S)
            print(f"after {IDLE_S:g} s idle: {_each()} MiB")
        finally:
            service.stop()


if __name__ == "__main__":
    asyncio.run(main())
