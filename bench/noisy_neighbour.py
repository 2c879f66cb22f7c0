"""Noisy neighbours: normal execs' latency with and without hostile tenants, in one run (issue 11).

A real service process (``python -m cellblock.server``, Docker cells, default warm pool)
serves 16 concurrent clients, each in its own scope:

- ``quiet``: 16 normal clients (the same 16-client load, no hostile ones).
- ``alone``: the noisy phase's 8 normal clients with nobody else (the same normal load).
- ``noisy``: 8 normal clients and 8 hostile ones, cycling through the classes of issue 11:
  a 2 MB program, a backtracking pattern against a host schema, a final value nested
  100,000 deep, a 1.5 MB untrusted schema registration, a timer storm, tool calls
  smuggled past the guest's pending count, an over-long tool-call id.

A normal exec is ``return 1`` after one nested call. Prints the normal execs' p50/p99
(ms) for each phase and the noisy phase's p99 against both baselines, and the service's RSS (its own process and its
worker processes) at start and at the end, 7 s after the last exec (past one periodic sweep,
after which the service returns freed heap to the system). ``BENCH_NORMAL_EXECS`` sets each
normal client's exec count (default 6).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from cellblock.client import CellblockClient, CellblockError, LimitOverrides, Scope, Tool

IMAGE = os.environ.get("CELLBLOCK_IMAGE", "cellblock-cell:dev")
NORMAL_EXECS = int(os.environ.get("BENCH_NORMAL_EXECS", "6"))
CLIENTS = 16
ROOT = Path(__file__).resolve().parents[1]
NORMAL = 'const r = await tools.callValue("host:core:echo", {n: 1}); return r.n;'
MATCH = Tool(source="host", owner="core", name="match", parameters={"type": "object", "properties": {"s": {"type": "string", "pattern": "^(a+)+$"}}})
ECHO = Tool(source="host", owner="core", name="echo")
WIDE = {"type": "object", "properties": {f"p{i}": {"type": "string", "description": "x" * 20} for i in range(20_000)}}


async def echo(tool_input: Any, call: Any) -> Any:
    return {"details": tool_input}


def percentile(samples: list[float], q: float) -> float:
    """The q-quantile (0..1) of samples by nearest rank."""
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def rss_mib(pid: int) -> float:
    """Resident set size of one process, MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def children(pid: int) -> list[int]:
    """Direct child processes of ``pid`` (the CPU worker pool)."""
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


async def normal_client(client: CellblockClient, n: int, samples: list[float]) -> None:
    scope = Scope(f"normal-{n}", "bench")
    await client.put_catalog(scope, [ECHO])
    for i in range(NORMAL_EXECS):
        started = time.perf_counter()
        result = await client.exec(scope, tool_call_id=f"n{n}-{i}", code=NORMAL, handlers={"echo": echo})
        samples.append((time.perf_counter() - started) * 1000)
        assert result.status == "completed" and result.value == 1, result.raw_json


async def wide_and_gone(client: CellblockClient, n: int) -> None:
    """Registers a 1.5 MB untrusted schema in a scope of its own, then ends that scope (no state kept)."""
    scope = Scope(f"hostile-{n}-wide", "bench")
    try:
        await client.put_catalog(scope, [Tool(source="mcp", owner="wide", name="w", parameters=WIDE)])
    finally:
        await client.delete_catalog(scope)


async def hostile_client(client: CellblockClient, n: int, stop: asyncio.Event, outcomes: dict[str, int]) -> None:
    scope = Scope(f"hostile-{n}", "bench")
    await client.put_catalog(scope, [ECHO, MATCH])
    deep = "let v = 0; for (let i = 0; i < 100000; i++) v = [v]; return v;"
    regex = 'for (let n = 20; n < 30; n++) { try { await tools.callValue("host:core:match", {s: "a".repeat(n) + "!"}); } catch (e) {} } return 1;'
    smuggle = 'let k = 0; const a = { toJSON() { if (k++ < 40) tools.callValue("host:core:echo", a).catch(() => {}); return {}; } }; try { await tools.callValue("host:core:echo", a); } catch (e) {} return 1;'
    storm = "for (let i = 0; i < 3000; i++) { try { setTimeout(() => {}, 1); } catch (e) {} } return 1;"
    attacks: list[tuple[str, Any]] = [
        ("huge program", lambda: client.exec(scope, tool_call_id="h", code="a;" * (1024 * 1024), handlers={})),
        ("backtracking pattern", lambda: client.exec(scope, tool_call_id="h", code=regex, handlers={})),
        ("deep value", lambda: client.exec(scope, tool_call_id="h", code=deep, handlers={})),
        ("huge untrusted schema", lambda: wide_and_gone(client, n)),
        ("timer storm", lambda: client.exec(scope, tool_call_id="h", code=storm, handlers={}, limits=LimitOverrides(max_pending_tool_calls=1))),
        ("smuggled calls", lambda: client.exec(scope, tool_call_id="h", code=smuggle, handlers={"echo": echo}, limits=LimitOverrides(max_pending_tool_calls=1))),
        ("long id", lambda: client.exec(scope, tool_call_id="x" * 1_000_000, code="return 1", handlers={})),
    ]
    i = n
    while not stop.is_set():
        name, attack = attacks[i % len(attacks)]
        i += 1
        try:
            await attack()
            outcomes[name] = outcomes.get(name, 0) + 1
        except CellblockError:
            outcomes[name] = outcomes.get(name, 0) + 1


async def phase(address: str, hostile: int, normal: int = CLIENTS) -> tuple[list[float], dict[str, int]]:
    """One phase: ``normal`` normal clients beside ``hostile`` hostile ones; the normal execs' latencies (ms)."""
    samples: list[float] = []
    outcomes: dict[str, int] = {}
    stop = asyncio.Event()
    async with await CellblockClient.connect(address) as client:
        attackers = [asyncio.ensure_future(hostile_client(client, n, stop, outcomes)) for n in range(hostile)]
        await asyncio.gather(*(normal_client(client, n, samples) for n in range(normal)))
        stop.set()
        await asyncio.gather(*attackers)
    return samples, outcomes


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def service_env(address: str, sockets: str, image: str, *, timeout_ms: int, **extra: str) -> dict[str, str]:
    """The environment of a bench's own ``python -m cellblock.server`` on ``address``.

    Its socket and state directories (its instance id, the SQLite run store) lie under
    ``sockets`` and go with it; ``extra`` adds or overrides ``CELLBLOCK_*`` settings.
    """
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(str(ROOT / p) for p in ("proto", "server", "client")),
        "CELLBLOCK_ADDRESS": address,
        "CELLBLOCK_IMAGE": image,
        "CELLBLOCK_SOCKET_DIR": sockets,
        "CELLBLOCK_STATE_DIR": os.path.join(sockets, "state"),
        "CELLBLOCK_CODE_MODE": json.dumps({"enabled": True, "timeoutMs": timeout_ms}),
        **extra,
    }


async def _ready(address: str, proc: subprocess.Popen[bytes]) -> None:
    import grpc  # noqa: PLC0415

    for _ in range(300):
        assert proc.poll() is None, "the service exited"
        try:
            async with grpc.aio.insecure_channel(address) as channel:
                await asyncio.wait_for(channel.channel_ready(), timeout=1)
                return
        except (TimeoutError, grpc.aio.AioRpcError):
            await asyncio.sleep(0.2)
    raise RuntimeError("the service did not start")


async def main() -> None:
    with tempfile.TemporaryDirectory(prefix="cellblock-noisy-") as sockets:
        address = f"127.0.0.1:{_free_port()}"
        env = service_env(
            address,
            sockets,
            IMAGE,
            timeout_ms=5000,
            # Latency is measured, not the busy bound: on a loaded machine 16 cell starts at once
            # can take longer than the default 10 s cell wait.
            CELLBLOCK_CELL_WAIT_MS=os.environ.get("CELLBLOCK_CELL_WAIT_MS", "60000"),
        )
        proc = subprocess.Popen([sys.executable, "-m", "cellblock.server"], env=env, stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL)  # noqa: S603
        try:
            await _ready(address, proc)
            await phase(address, 0)  # warm-up: workers started, pool filled
            rss_start = rss_mib(proc.pid)
            quiet, _ = await phase(address, 0)
            alone, _ = await phase(address, 0, CLIENTS // 2)
            noisy, outcomes = await phase(address, CLIENTS // 2, CLIENTS // 2)
            # Idle past one periodic sweep (5 s), after which the service hands freed memory back.
            await asyncio.sleep(7)
            rss_end = rss_mib(proc.pid)
            workers = [rss_mib(c) for c in children(proc.pid)]
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
    print(f"noisy neighbour: {CLIENTS} clients, {NORMAL_EXECS} normal execs per normal client (ms)")
    print(f"{'phase':34} {'execs':>6} {'p50':>9} {'p99':>9}")
    print(f"{'quiet (16 normal)':34} {len(quiet):6} {percentile(quiet, 0.5):9.1f} {percentile(quiet, 0.99):9.1f}")
    print(f"{'alone (8 normal)':34} {len(alone):6} {percentile(alone, 0.5):9.1f} {percentile(alone, 0.99):9.1f}")
    print(f"{'noisy (8 normal + 8 hostile)':34} {len(noisy):6} {percentile(noisy, 0.5):9.1f} {percentile(noisy, 0.99):9.1f}")
    print(f"p99 ratio noisy/quiet (same 16-client load): {percentile(noisy, 0.99) / percentile(quiet, 0.99):.2f}x (issue 11 bound: 2x)")
    print(f"p99 ratio noisy/alone (same normal load): {percentile(noisy, 0.99) / percentile(alone, 0.99):.2f}x (issue 11 bound: 2x)")
    print(f"hostile requests finished: {sum(outcomes.values())} {outcomes}")
    print(f"service RSS: start {rss_start:.0f} MiB, end {rss_end:.0f} MiB (delta {rss_end - rss_start:+.0f} MiB); workers {[round(w) for w in workers]} MiB")


if __name__ == "__main__":
    asyncio.run(main())
