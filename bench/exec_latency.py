"""Exec latency beside its baselines, measured in one run.

Rows:
- ``cellblock exec (trivial)``: a full Exec RPC of ``return 1`` through a real
  service with the Docker executor and its default warm pool (a pooled cell when
  one is ready, else a fresh one; VM, bridge, teardown).
- ``cellblock exec (10 nested calls)``: the same with ten sequential nested
  calls answered by a Python handler over the Exec stream.
- ``bare docker run --rm``: ``docker run --rm`` of the same cell image running
  ``python3 -c pass`` with the same lockdown flags: the container floor.
- ``in-process quickjs-rs``: a fresh quickjs-rs runtime evaluating the same
  program in this process: the engine floor.

Prints p50/p95 in milliseconds and the ratios of each cellblock row to both
baselines. Run with ``make bench`` (``BENCH_ROUNDS`` sets the sample count).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import Any

from quickjs_rs import Runtime

from cellblock.client import CellblockClient, Scope, Tool
from cellblock.server.app import ServerSettings, start_service

IMAGE = os.environ.get("CELLBLOCK_IMAGE", "cellblock-cell:dev")
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "15"))
NESTED = "let s = 0; for (let i = 0; i < 10; i++) { s += (await tools.echo({ n: i })).n; } return s;"


def percentile(samples: list[float], q: float) -> float:
    """Returns the q-quantile (0..1) of samples by nearest rank."""
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


async def timed(fn: Callable[[], Awaitable[Any]], rounds: int) -> list[float]:
    """Runs fn rounds times after one warm-up; returns wall times in ms."""
    await fn()
    out = []
    for _ in range(rounds):
        start = time.perf_counter()
        await fn()
        out.append((time.perf_counter() - start) * 1000)
    return out


def docker_run_baseline() -> None:
    subprocess.run(
        ["docker", "run", "--rm", "--network", "none", "--read-only", "--cap-drop", "ALL", "--security-opt", "no-new-privileges:true",
         "--user", "65532:65532", "--pids-limit", "64", "--memory", "256m", "--entrypoint", "python3", IMAGE, "-c", "pass"],
        check=True, stdout=subprocess.DEVNULL,
    )


def quickjs_baseline(program: str) -> None:
    with Runtime() as rt, rt.new_context() as ctx:
        ctx.register("echo", lambda n: {"n": n}, is_async=False)
        ctx.eval(f"globalThis.out = null; (async () => {{ const tools = {{ echo: async (o) => echo(o.n) }}; {program} }})().then(v => {{ globalThis.out = v; }}); 0")
        ctx._engine_ctx.run_pending_jobs()  # private API of the pinned quickjs-rs: drain the job queue
        assert ctx.eval("globalThis.out") == 45


async def main() -> None:
    with tempfile.TemporaryDirectory(prefix="cellblock-bench-") as sockets:
        service = await start_service(ServerSettings(address="127.0.0.1:0", image=IMAGE, code_mode={"enabled": True}, socket_dir=sockets))
        try:
            async with await CellblockClient.connect(service.address) as client:
                scope = Scope(session_id="bench", agent_run_id="bench")
                echo_schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"], "additionalProperties": False}
                await client.put_catalog(scope, [Tool(source="host", owner="core", name="echo", parameters=echo_schema)])

                async def echo(tool_input: dict[str, Any], call: Any) -> dict[str, Any]:
                    return {"details": {"n": tool_input["n"]}}

                async def trivial() -> None:
                    r = await client.exec(scope, tool_call_id="bench", code="return 1", handlers={})
                    assert r.status == "completed", r.raw_json

                async def nested() -> None:
                    r = await client.exec(scope, tool_call_id="bench", code=NESTED, handlers={"echo": echo})
                    assert r.status == "completed" and r.value == 45, r.raw_json

                rows = {
                    "cellblock exec (trivial)": await timed(trivial, ROUNDS),
                    "cellblock exec (10 nested calls)": await timed(nested, ROUNDS),
                    "bare docker run --rm": await timed(lambda: asyncio.to_thread(docker_run_baseline), ROUNDS),
                    "in-process quickjs-rs": await timed(lambda: asyncio.to_thread(quickjs_baseline, NESTED), ROUNDS),
                }
        finally:
            await service.stop()
    print(f"exec latency, {ROUNDS} rounds each (ms)")
    print(f"{'row':36} {'p50':>9} {'p95':>9} {'mean':>9}")
    for name, samples in rows.items():
        print(f"{name:36} {percentile(samples, 0.5):9.1f} {percentile(samples, 0.95):9.1f} {statistics.fmean(samples):9.1f}")
    docker_p50 = percentile(rows["bare docker run --rm"], 0.5)
    qjs_p50 = percentile(rows["in-process quickjs-rs"], 0.5)
    print("\nratios (p50)")
    for name in ("cellblock exec (trivial)", "cellblock exec (10 nested calls)"):
        p50 = percentile(rows[name], 0.5)
        print(f"{name:36} {p50 / docker_p50:6.2f}x bare docker run   {p50 / qjs_p50:8.1f}x in-process quickjs-rs")


if __name__ == "__main__":
    asyncio.run(main())
