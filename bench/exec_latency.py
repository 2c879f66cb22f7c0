"""Cellblock's latency and throughput rows beside their baselines, in one run.

Sections (each printed as one table, then the ratios with their targets):

- floors: in-process quickjs-rs, the raw two-hop gRPC ping-pong, bare
  ``docker run`` (bench/baselines.py, bench/pingpong.py).
- pool hit: a trivial exec, 100 sequential nested calls, and a wait that
  resumes, each sample taken once the warm pool has a ready cell again.
- back to back: the same three rows with no idle time between samples.
- exec/wait pairs: a plain exec sent right after a plain exec, a wait sent
  right after its exec returned ``waiting``, and the exec → wait round trip;
  each pair starts from a refilled pool (:func:`_pairs`).
- cold start: a service without a pool (every leg starts its container) beside
  bare ``docker run``.
- throughput: trivial runs from 16 concurrent clients for cellblock
  (``leg`` and ``scope`` reuse), llm-sandbox and bare ``docker run``, twice:
  cold (fresh scopes, no warm-up: with ``scope`` every scope's first leg
  starts a cell) and steady state (each client runs one unmeasured leg, then
  the measured runs start together).

Every cellblock row goes through a real service (Docker executor, gRPC over
TCP) and a real client. ``BENCH_ROUNDS`` sets the sample count of the fast rows.
"""

from __future__ import annotations

import asyncio
import functools
import os
import tempfile
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from bench import baselines, pingpong
from bench._report import Report, attempt, percentile, timed
from cellblock.client import CellblockClient, LimitOverrides, Scope, Tool
from cellblock.server.app import ServerSettings, Service, start_service

__all__ = ["percentile", "run"]

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "10"))
SLOW_ROUNDS = max(3, ROUNDS // 2)
CLIENTS = 16
#: Cold throughput (as before): 4 runs per client on fresh scopes, so with
#: ``scope`` a quarter of the runs are a scope's first leg and start a cell.
COLD_RUNS = 4
#: Steady state: measured runs per client after one unmeasured leg each.
STEADY_RUNS = int(os.environ.get("BENCH_STEADY_RUNS", "4"))
#: The Docker-per-run rows keep no warm state; their steady rows take this
#: many runs per client under the same 16-client load, so the rate is stable.
DOCKER_STEADY_RUNS = int(os.environ.get("BENCH_DOCKER_STEADY_RUNS", "3"))
NESTED100 = "let s = 0; for (let i = 0; i < 100; i++) { s += (await tools.echo({ n: i })).n; } return s;"
STATE = "const rows = Array.from({length: 2000}, (_, i) => ({id: i, name: 'row ' + i}));"
SUSPENDS = STATE + " const y = await yield_control('bench'); return rows.length + (y.status === 'yielded' ? 1 : 0);"
#: Every bench leg gets 30 s: 100 nested calls must finish in one leg, and a
#: loaded machine must not turn a slow sample into a failed run.
LONG = LimitOverrides(timeout_ms=30000)
ECHO_SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"], "additionalProperties": False}


async def _echo(tool_input: dict[str, Any], call: Any) -> dict[str, Any]:
    return {"details": {"n": tool_input["n"]}}


async def _service(sockets: str, warm_pool: int, cell_reuse: str = "leg") -> Service:
    # Each service its own socket and state directory (an instance locks both).
    own = tempfile.mkdtemp(prefix="service-", dir=sockets)
    settings = ServerSettings(
        address="127.0.0.1:0", image=baselines.IMAGE, code_mode={"enabled": True}, socket_dir=own, state_dir=os.path.join(own, "state"), warm_pool=warm_pool, cell_reuse=cell_reuse
    )
    return await start_service(settings)


class _Cellblock:
    """A client and scope with the echo tool registered."""

    def __init__(self, client: CellblockClient, service: Service, name: str) -> None:
        self.client = client
        self.service = service
        self.scope = Scope(session_id=name, agent_run_id=name)

    async def setup(self) -> None:
        await self.client.put_catalog(self.scope, [Tool(source="host", owner="core", name="echo", parameters=ECHO_SCHEMA)])

    async def trivial(self) -> None:
        r = await self.client.exec(self.scope, tool_call_id="t", code="return 1", handlers={}, limits=LONG)
        assert r.status == "completed", r.raw_json

    async def nested(self) -> None:
        r = await self.client.exec(self.scope, tool_call_id="n", code=NESTED100, handlers={"echo": _echo}, limits=LONG)
        assert r.status == "completed" and r.value == 4950, r.raw_json

    async def suspend(self) -> str:
        r = await self.client.exec(self.scope, tool_call_id="s", code=SUSPENDS, handlers={}, limits=LONG)
        assert r.status == "waiting" and r.run_id, r.raw_json
        return r.run_id

    async def resume(self, run_id: str) -> None:
        r = await self.client.wait(self.scope, tool_call_id="w", run_id=run_id)
        assert r.status == "completed" and r.value == 2001, r.raw_json

    async def pool_ready(self, cells: int | None = None) -> None:
        """Waits (at most 10 s) until the pool holds ``cells`` ready cells (None: its whole target).

        The pool-hit rows wait for the whole target, so no sample starts while a
        refill's container starts beside it (a pool of 2 with 1 ready would be).
        """
        pool = self.service.pool
        assert pool is not None
        for _ in range(400):
            if pool.ready_count >= (pool.target_size() if cells is None else cells):
                return
            await asyncio.sleep(0.025)


async def _resumes(cb: _Cellblock, rounds: int, refill: bool) -> list[float]:
    out = []
    for _ in range(rounds + 1):
        run_ids: list[str] = []
        if not await attempt(lambda ids=run_ids: _append(ids, cb.suspend())):
            continue
        if refill:
            await cb.pool_ready()
        t = time.perf_counter()
        if await attempt(lambda ids=run_ids: cb.resume(ids[0])):
            out.append((time.perf_counter() - t) * 1000)
    return out[1:]


async def _append(into: list[str], value: Awaitable[str]) -> None:
    into.append(await value)


async def _pairs(cb: _Cellblock, report: Report) -> None:
    """Two-leg pairs, each started from a refilled pool; the second leg is sent as soon as the first returns.

    A plain pair is ``exec, exec`` (the second is measured), a resume pair is
    ``exec`` returning ``waiting``, then its ``wait`` (the wait is measured,
    and both legs as the round trip). Every pair starts once the pool holds
    two ready cells again, so the two kinds of pair meet the same pool and
    both of their legs can take a pooled cell. (Until 2026-12-01 the four
    legs of a round ran back to back with no refill: the measured plain exec
    was a round's second leg and the exec that suspends its third, so the
    round trip mostly paid for container churn, not the resume.)
    """
    plain, resumed, trip = [], [], []
    for _ in range(ROUNDS + 1):
        run_ids: list[str] = []
        await cb.pool_ready(2)
        ok = await attempt(cb.trivial)
        t0 = time.perf_counter()
        ok = ok and await attempt(cb.trivial)
        t1 = time.perf_counter()
        await cb.pool_ready(2)
        t2 = time.perf_counter()
        ok = ok and await attempt(lambda ids=run_ids: _append(ids, cb.suspend()))
        t3 = time.perf_counter()
        ok = ok and await attempt(lambda ids=run_ids: cb.resume(ids[0]))
        t4 = time.perf_counter()
        if not ok:
            continue
        plain.append((t1 - t0) * 1000)
        resumed.append((t4 - t3) * 1000)
        trip.append((t4 - t2) * 1000)
    # The first pair warms both paths (as in _resumes).
    report.add("pairs", "plain exec right after a plain exec", plain[1:])
    report.add("pairs", "wait right after its exec returned waiting", resumed[1:], "2000-row heap snapshot")
    report.add("pairs", "exec -> wait round trip", trip[1:])


async def _concurrent(one: Callable[[int], Awaitable[None]], per_client: int, *, warm: bool = False) -> tuple[list[float], float]:
    """``per_client`` calls of ``one`` from each of CLIENTS concurrent clients.

    Args:
        one: One run for client ``c``.
        per_client: Measured runs per client.
        warm: Steady state: every client first runs one unmeasured leg, and the
            clock starts once all of them have (so no measured run is a
            scope's first leg or overlaps another client's warm-up).

    Returns:
        The measured latencies (ms) and the completed measured runs per second.
    """
    latencies: list[float] = []
    barrier = asyncio.Barrier(CLIENTS + 1)

    async def client(c: int) -> None:
        if warm:
            await attempt(lambda: one(c))
            await barrier.wait()
        for _ in range(per_client):
            t = time.perf_counter()
            if await attempt(lambda: one(c)):
                latencies.append((time.perf_counter() - t) * 1000)

    clients = [asyncio.ensure_future(client(c)) for c in range(CLIENTS)]
    if warm:
        await barrier.wait()
    start = time.perf_counter()
    await asyncio.gather(*clients)
    return latencies, len(latencies) / (time.perf_counter() - start)


def _add_rate(report: Report, rates: dict[str, float], key: str, name: str, measured: tuple[list[float], float], warm: bool) -> None:
    samples, rates[key] = measured
    section = "throughput steady" if warm else "throughput cold"
    report.add(section, name, samples, f"{rates[key]:.2f} runs/s")


async def _trivial_of(cbs: list[_Cellblock], c: int) -> None:
    await cbs[c].trivial()


async def _cellblock_throughput(service: Service, report: Report, rates: dict[str, float], mode: str) -> None:
    """Cold, then steady state: trivial execs from CLIENTS clients, each client its own scope (a runtime's agent run)."""
    clients = [await CellblockClient.connect(service.address) for _ in range(CLIENTS)]
    try:
        for warm, per_client in ((False, COLD_RUNS), (True, STEADY_RUNS)):
            phase = "steady" if warm else "cold"
            cbs = [_Cellblock(c, service, f"tp-{mode}-{phase}-{i}") for i, c in enumerate(clients)]
            for cb in cbs:
                await cb.setup()
            measured = await _concurrent(functools.partial(_trivial_of, cbs), per_client, warm=warm)
            _add_rate(report, rates, f"{mode} {phase}", f"cellblock exec, CELLBLOCK_CELL_REUSE={mode}", measured, warm)
    finally:
        for c in clients:
            await c.close()


async def _docker_throughput(report: Report, rates: dict[str, float], key: str, name: str, run_one: Callable[[], None]) -> None:
    # One thread per client: asyncio.to_thread's default pool has min(32, cores + 4)
    # threads, which would hold a 2-core machine's Docker rows to 6 concurrent runs.
    loop = asyncio.get_running_loop()
    with ThreadPoolExecutor(max_workers=CLIENTS, thread_name_prefix=key) as threads:
        for warm, per_client in ((False, 1), (True, DOCKER_STEADY_RUNS)):
            measured = await _concurrent(lambda c: loop.run_in_executor(threads, run_one), per_client, warm=warm)
            _add_rate(report, rates, f"{key} {'steady' if warm else 'cold'}", name, measured, warm)


async def _throughput(service: Service, sockets: str, report: Report) -> dict[str, float]:
    """Every throughput row, cold and steady; keys ``"<row> cold"`` and ``"<row> steady"`` (runs/s)."""
    rates: dict[str, float] = {}
    await _cellblock_throughput(service, report, rates, "leg")
    scoped = await _service(sockets, warm_pool=2, cell_reuse="scope")
    try:
        await _cellblock_throughput(scoped, report, rates, "scope")
    finally:
        await scoped.stop()
    await _docker_throughput(report, rates, "llm-sandbox", "llm-sandbox (Docker per run, node)", baselines.llm_sandbox_run)
    await _docker_throughput(report, rates, "docker", "bare docker run --rm", baselines.docker_run_baseline)
    return rates


async def run(report: Report) -> None:
    """Measures every section into ``report`` and prints the tables and ratios."""
    baselines.ensure_node_image()
    report.add("floors", "in-process quickjs-rs (10 nested, as before)", await timed(lambda: asyncio.to_thread(baselines.quickjs_baseline), ROUNDS))
    report.add("floors", "raw grpc.aio two-hop ping-pong (one round trip)", await pingpong.measure(200))
    report.add("floors", "bare docker run --rm", await timed(lambda: asyncio.to_thread(baselines.docker_run_baseline), SLOW_ROUNDS))
    report.table("floors", "Floors (same run)")
    with tempfile.TemporaryDirectory(prefix="cellblock-bench-") as sockets:
        service = await _service(sockets, warm_pool=2)
        try:
            async with await CellblockClient.connect(service.address) as client:
                cb = _Cellblock(client, service, "bench")
                await cb.setup()
                report.add("pool hit", "trivial exec", await timed(cb.trivial, ROUNDS, before=cb.pool_ready))
                report.add("pool hit", "100 sequential nested calls", await timed(cb.nested, ROUNDS, before=cb.pool_ready))
                report.add("pool hit", "wait that resumes", await _resumes(cb, ROUNDS, refill=True), "2000-row heap snapshot")
                report.table("pool hit", "Pool hit (the pool refilled before each sample)")
                report.add("back to back", "trivial exec", await timed(cb.trivial, ROUNDS))
                report.add("back to back", "100 sequential nested calls", await timed(cb.nested, ROUNDS))
                report.add("back to back", "wait that resumes", await _resumes(cb, ROUNDS, refill=False), "2000-row heap snapshot")
                report.table("back to back", "Back to back (no idle time for the pool to refill)")
                await _pairs(cb, report)
                report.table("pairs", "Exec/wait pairs (each pair from a refilled pool, its second leg sent right after the first)")
            rates = await _throughput(service, sockets, report)
            report.table("throughput cold", f"Throughput, cold: trivial runs from {CLIENTS} concurrent clients on fresh scopes ({COLD_RUNS} per client per cellblock row, 1 per client per Docker-per-run row)")
            report.table(
                "throughput steady",
                f"Throughput, steady state: one unmeasured leg per client, then {STEADY_RUNS} per client per cellblock row, {DOCKER_STEADY_RUNS} per client per Docker-per-run row ({CLIENTS} clients)",
            )
            pool = service.pool
            pool_note = f"pool hits {pool.hits}, misses {pool.misses}" if pool is not None else ""
        finally:
            await service.stop()
        cold_service = await _service(sockets, warm_pool=0)
        try:
            async with await CellblockClient.connect(cold_service.address) as client:
                cb = _Cellblock(client, cold_service, "cold")
                await cb.setup()
                report.add("cold start", "trivial exec, no pool (container start per leg)", await timed(cb.trivial, SLOW_ROUNDS))
                report.add("cold start", "bare docker run --rm", await timed(lambda: asyncio.to_thread(baselines.docker_run_baseline), SLOW_ROUNDS))
                report.table("cold start", "Cold start (a service without a pool)")
        finally:
            await cold_service.stop()
    _print(report, rates, pool_note)


def _print(report: Report, rates: dict[str, float], pool_note: str) -> None:
    if pool_note:
        report.say(f"  ({pool_note} over the pooled service's whole run)")
    g = report.get
    qjs = g("in-process quickjs-rs (10 nested, as before)").p50
    ping = g("raw grpc.aio two-hop ping-pong (one round trip)").p50
    report.say("\n## Ratios (p50 unless noted)")
    for section in ("pool hit", "back to back"):
        rows = [r for r in report.rows if r.section == section]
        trivial, nested = rows[0].p50, rows[1].p50
        per_call = (nested - trivial) / 100
        report.ratio(f"{section}: trivial exec / in-process quickjs-rs", trivial / qjs, 4)
        report.ratio(f"{section}: per nested call ({per_call:.2f} ms) / two-hop ping-pong", per_call / ping, 3)
        report.ratio(f"{section}: wait that resumes / trivial exec", rows[2].p50 / trivial)
    plain = g("plain exec right after a plain exec").p50
    report.ratio("wait right after its exec / plain exec right after a plain exec", g("wait right after its exec returned waiting").p50 / plain, 1.5)
    report.ratio("exec -> wait round trip / plain exec right after a plain exec", g("exec -> wait round trip").p50 / plain, 2.5)
    cold = [r for r in report.rows if r.section == "cold start"]
    report.ratio("cold start / bare docker run (same section)", cold[0].p50 / cold[1].p50)
    for phase in ("cold", "steady"):
        sandbox = rates[f"llm-sandbox {phase}"]
        report.ratio(f"throughput {phase}: cellblock leg / llm-sandbox {phase}", rates[f"leg {phase}"] / sandbox, 1.5, at_most=False)
        report.ratio(f"throughput {phase}: cellblock scope / llm-sandbox {phase}", rates[f"scope {phase}"] / sandbox, 15, at_most=False)
        report.ratio(f"throughput {phase}: cellblock leg / bare docker run {phase}", rates[f"leg {phase}"] / rates[f"docker {phase}"])
