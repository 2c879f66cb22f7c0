"""Suspend → resume beside a plain exec, measured in one run.

Rows (p50/p95 in ms):
- ``plain exec``: ``return 1`` in a fresh cell (the baseline).
- ``exec that suspends``: ``yield_control()`` after building some state; the
  leg ends with the VM serialised, compressed and stored on the host.
- ``wait that resumes``: a fresh cell restores the snapshot and completes.
- ``exec -> wait round trip``: the two legs together.
- ``in-process snapshot`` / ``in-process restore``: quickjs-rs alone, the
  engine floor for the same heap.

Also prints snapshot sizes (raw VM image and compressed bytes on the wire)
and the ratios of each cellblock row to the plain exec. ``make bench`` runs it
after the exec latency bench; ``BENCH_ROUNDS`` sets the sample count.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import tempfile
import time
import zlib

from quickjs_rs import Runtime, Snapshot

from bench.exec_latency import percentile
from cellblock.client import CellblockClient, Scope, Tool
from cellblock.server.app import ServerSettings, start_service

IMAGE = os.environ.get("CELLBLOCK_IMAGE", "cellblock-cell:dev")
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "10"))
STATE = "const rows = Array.from({length: 2000}, (_, i) => ({id: i, name: 'row ' + i}));"
PROGRAM = STATE + " const y = await yield_control('bench'); return rows.length + (y.status === 'yielded' ? 1 : 0);"


def engine_floor() -> tuple[list[float], list[float], int, int]:
    snaps, restores = [], []
    raw_size = compressed = 0
    for _ in range(ROUNDS):
        with Runtime() as rt, rt.new_context() as ctx:
            ctx.eval(STATE.replace("const rows", "globalThis.rows"))
            t = time.perf_counter()
            raw = ctx.create_snapshot().to_bytes()
            packed = zlib.compress(raw, 6)
            snaps.append((time.perf_counter() - t) * 1000)
            raw_size, compressed = len(raw), len(packed)
        with Runtime() as rt2, rt2.new_context() as ctx2:
            t = time.perf_counter()
            rt2.restore_snapshot(Snapshot.from_bytes(zlib.decompress(packed)), ctx2)
            restores.append((time.perf_counter() - t) * 1000)
            assert ctx2.eval("rows.length") == 2000
    return snaps, restores, raw_size, compressed


async def main() -> None:
    rows: dict[str, list[float]] = {"plain exec": [], "exec that suspends": [], "wait that resumes": [], "exec -> wait round trip": []}
    sizes: list[int] = []
    with tempfile.TemporaryDirectory(prefix="cellblock-bench-") as sockets:
        service = await start_service(ServerSettings(address="127.0.0.1:0", image=IMAGE, code_mode={"enabled": True}, socket_dir=sockets))
        try:
            async with await CellblockClient.connect(service.address) as client:
                scope = Scope(session_id="bench", agent_run_id="bench")
                await client.put_catalog(scope, [Tool(source="host", owner="core", name="noop")])
                await client.exec(scope, tool_call_id="warm", code="return 1", handlers={})
                for n in range(ROUNDS):
                    t0 = time.perf_counter()
                    plain = await client.exec(scope, tool_call_id=f"p{n}", code="return 1", handlers={})
                    t1 = time.perf_counter()
                    first = await client.exec(scope, tool_call_id=f"s{n}", code=PROGRAM, handlers={})
                    t2 = time.perf_counter()
                    assert plain.status == "completed" and first.status == "waiting", first.raw_json
                    sizes.append(first.metadata.snapshot_bytes)
                    done = await client.wait(scope, tool_call_id=f"w{n}", run_id=first.run_id)
                    t3 = time.perf_counter()
                    assert done.status == "completed" and done.value == 2001, done.raw_json
                    rows["plain exec"].append((t1 - t0) * 1000)
                    rows["exec that suspends"].append((t2 - t1) * 1000)
                    rows["wait that resumes"].append((t3 - t2) * 1000)
                    rows["exec -> wait round trip"].append((t3 - t1) * 1000)
        finally:
            await service.stop()
    snaps, restores, raw_size, compressed = await asyncio.to_thread(engine_floor)
    rows["in-process snapshot (+zlib)"] = snaps
    rows["in-process restore (+unzlib)"] = restores
    print(f"suspend -> resume, {ROUNDS} rounds each (ms)")
    print(f"{'row':34} {'p50':>9} {'p95':>9} {'mean':>9}")
    for name, samples in rows.items():
        print(f"{name:34} {percentile(samples, 0.5):9.1f} {percentile(samples, 0.95):9.1f} {statistics.fmean(samples):9.1f}")
    print(f"\nsnapshot bytes: raw VM image {raw_size}, compressed in-process {compressed}, stored by cellblock (p50) {int(percentile([float(s) for s in sizes], 0.5))}")
    base = percentile(rows["plain exec"], 0.5)
    print("\nratios to plain exec (p50)")
    for name in ("exec that suspends", "wait that resumes", "exec -> wait round trip"):
        print(f"{name:34} {percentile(rows[name], 0.5) / base:6.2f}x")


if __name__ == "__main__":
    asyncio.run(main())
