"""Run store: park and resume latency on memory:, SQLite and PostgreSQL side by side, in one run.

Two parts, each reported as p50/p95 in ms and as ratios to ``memory:``:

- **store operations**: what the run store adds to a leg. *park* = the slot
  reservation plus the park transaction (encode the run, write record and
  snapshot together); *resume* = the claim (read record and snapshot, decode
  the run with its catalog view) plus the removal when the run ends. The run
  has a 50-tool catalog view and a real QuickJS snapshot (a 2000-row heap,
  compressed as cells send it).
- **end to end**: a service with Docker cells on each store; an exec that
  parks (``yield_control``) and the wait that resumes it, as the runtime sees them.

Also prints the bytes stored per suspended run (snapshot and record body).
PostgreSQL is a throwaway cluster with fsync on (``tests/support/postgres.py``) unless
``BENCH_PG_DSN`` names a server. ``BENCH_STORE_ROUNDS`` (else ``BENCH_ROUNDS``) sets the sample count.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import tempfile
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from quickjs_rs import Runtime

from bench._report import percentile
from cellblock.client import CellblockClient, Scope, Tool
from cellblock.server.api._catalogs import ScopeCatalog
from cellblock.server.app import ServerSettings, start_service
from cellblock.server.config import CodeModeConfig
from cellblock.server.runs import OutputBudget, Run, RunRegistry
from cellblock.server.runs._protocol import BridgeMethod, Claimed, ResolvedCall
from cellblock.server.runs._state import PendingRequest
from cellblock.server.store import make_run_store

IMAGE = os.environ.get("CELLBLOCK_IMAGE", "cellblock-cell:dev")
ROUNDS = int(os.environ.get("BENCH_STORE_ROUNDS") or os.environ.get("BENCH_ROUNDS", "30"))
E2E_ROUNDS = max(3, ROUNDS // 3)
STATE = "globalThis.rows = Array.from({length: 2000}, (_, i) => ({id: i, name: 'row ' + i}));"
PROGRAM = STATE.replace("globalThis.rows", "const rows") + " const y = await yield_control('bench'); return rows.length;"
TOOLS = [
    {"source": "host", "owner": "core", "name": f"tool_{i}", "description": f"Tool number {i}.", "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}
    for i in range(50)
]


def real_snapshot() -> bytes:
    """A compressed QuickJS snapshot of the benchmark heap (as a cell stores it)."""
    with Runtime() as rt, rt.new_context() as ctx:
        ctx.eval(STATE)
        return zlib.compress(ctx.create_snapshot().to_bytes(), 6)


@contextmanager
def postgres_dsn() -> Iterator[str]:
    if os.environ.get("BENCH_PG_DSN"):
        yield os.environ["BENCH_PG_DSN"]
        return
    from tests.support.postgres import throwaway_cluster  # noqa: PLC0415 - only without BENCH_PG_DSN

    with throwaway_cluster(prefix="cellblock-bench-pg-", durable=True) as cluster:
        yield cluster.database("bench")


def _run(n: int, view: Any) -> Run:
    config = CodeModeConfig()
    run = Run(
        run_id=f"run_{n:032x}", session_id="bench", agent_run_id="bench", tool_call_id=f"t{n}", turn_id="", replay_id="replay_x",
        limits=config.limits, restart_safe=False, view=view, budget=OutputBudget(config.max_output_bytes),
    )
    call = ResolvedCall(entry=view.entry("host:core:tool_1"), input={"q": "x"}, replay_safe=False, label="host:core:tool_1")
    run.pending["bridge:callValue:1"] = PendingRequest("bridge:callValue:1", BridgeMethod.CALL_VALUE, ["host:core:tool_1", {"q": "x"}], nested_call_id="n1", call=call, dispatched=True)
    return run


async def store_ops(url: str, snapshot: bytes) -> tuple[list[float], list[float], int, int]:
    catalog = ScopeCatalog(CodeModeConfig())
    catalog.catalog.register(TOOLS)
    store = make_run_store(url, 1_000_000)
    await store.open()
    registry = RunRegistry(store, restore_view=lambda state, _scope: catalog.restore_view(state))
    parks, resumes = [], []
    body = 0
    try:
        for n in range(ROUNDS + 1):
            run = _run(n, catalog.view())
            t0 = time.perf_counter()
            assert await registry.reserve_slot(run)
            assert await registry.park(run, snapshot)
            parked = time.perf_counter()
            record = await store.get(run.run_id)  # untimed: only for the stored size
            assert record is not None
            body = len(record.body)
            t1 = time.perf_counter()
            claimed = await registry.claim(run.run_id, "bench", "bench")
            assert isinstance(claimed, Claimed) and claimed.snapshot == snapshot, claimed
            await registry.remove(claimed.run)
            t2 = time.perf_counter()
            if n:  # the first round warms connections and caches
                parks.append((parked - t0) * 1000)
                resumes.append((t2 - t1) * 1000)
    finally:
        await store.close()
    return parks, resumes, len(snapshot), body


async def end_to_end(url: str) -> tuple[list[float], list[float], int]:
    parks, resumes, sizes = [], [], []
    with tempfile.TemporaryDirectory(prefix="cellblock-bench-") as sockets:
        settings = ServerSettings(address="127.0.0.1:0", image=IMAGE, code_mode={"enabled": True}, socket_dir=sockets, state_dir=os.path.join(sockets, "state"), store=url)
        service = await start_service(settings)
        try:
            async with await CellblockClient.connect(service.address) as client:
                scope = Scope(session_id="bench-e2e", agent_run_id="bench")
                await client.put_catalog(scope, [Tool(source="host", owner="core", name="noop")])
                await client.exec(scope, tool_call_id="warm", code="return 1", handlers={})
                for n in range(E2E_ROUNDS):
                    t0 = time.perf_counter()
                    first = await client.exec(scope, tool_call_id=f"s{n}", code=PROGRAM, handlers={})
                    t1 = time.perf_counter()
                    assert first.status == "waiting", first.raw_json
                    sizes.append(first.metadata.snapshot_bytes)
                    done = await client.wait(scope, tool_call_id=f"w{n}", run_id=first.run_id)
                    t2 = time.perf_counter()
                    assert done.status == "completed" and done.value == 2000, done.raw_json
                    parks.append((t1 - t0) * 1000)
                    resumes.append((t2 - t1) * 1000)
        finally:
            await service.stop()
    return parks, resumes, int(percentile([float(s) for s in sizes], 0.5))


def _table(title: str, rows: dict[str, tuple[list[float], list[float]]]) -> None:
    print(f"\n{title} (ms)")
    print(f"{'store':12} {'park p50':>9} {'p95':>8} {'resume p50':>11} {'p95':>8} {'park x':>7} {'resume x':>9}")
    base_park, base_resume = (percentile(s, 0.5) for s in rows["memory:"])
    for name, (parks, resumes) in rows.items():
        p, r = percentile(parks, 0.5), percentile(resumes, 0.5)
        print(f"{name:12} {p:9.2f} {percentile(parks, 0.95):8.2f} {r:11.2f} {percentile(resumes, 0.95):8.2f} {p / base_park:6.2f}x {r / base_resume:8.2f}x")


async def main() -> None:
    snapshot = await asyncio.to_thread(real_snapshot)
    with tempfile.TemporaryDirectory(prefix="cellblock-bench-sqlite-") as state, postgres_dsn() as pg:
        urls = {"memory:": "memory:", "sqlite": f"sqlite://{state}/runs.sqlite3", "postgresql": pg}
        ops: dict[str, tuple[list[float], list[float]]] = {}
        stored: dict[str, tuple[int, int]] = {}
        for name, url in urls.items():
            parks, resumes, snap, body = await store_ops(url, snapshot)
            ops[name] = (parks, resumes)
            stored[name] = (snap, body)
        e2e: dict[str, tuple[list[float], list[float]]] = {}
        e2e_sizes: dict[str, int] = {}
        for name, url in urls.items():
            parks, resumes, size = await end_to_end(url if name != "sqlite" else f"sqlite://{state}/e2e.sqlite3")
            e2e[name] = (parks, resumes)
            e2e_sizes[name] = size
    print(f"run store: {ROUNDS} store rounds, {E2E_ROUNDS} end-to-end rounds per store")
    _table("store operations: park = reserve slot + park transaction; resume = claim + decode + remove", ops)
    _table("end to end: exec that parks; wait that resumes (Docker cells)", e2e)
    print("\nbytes stored per suspended run (store operations: 50-tool view, 2000-row heap)")
    for name, (snap, body) in stored.items():
        print(f"{name:12} snapshot {snap:8d}  record body {body:7d}  total {snap + body:8d}")
    print("end-to-end snapshot bytes (p50): " + ", ".join(f"{k} {v}" for k, v in e2e_sizes.items()))
    print(f"mean park p50 over stores: {statistics.fmean(percentile(p, 0.5) for p, _ in ops.values()):.2f} ms")


if __name__ == "__main__":
    asyncio.run(main())
