"""Noisy neighbours: normal execs' latency with and without hostile tenants, in one run (issue 11).

A real service process (``python -m cellblock.server``, Docker cells, default warm pool)
serves 16 concurrent clients, each in its own scope:

- ``quiet``: 16 normal clients (the same 16-client load, no hostile ones).
- ``alone``: the noisy phase's 8 normal clients with nobody else (the same normal load).
- ``noisy``: 8 normal clients and 8 hostile ones, cycling through the classes of issue 11
  (:func:`attacks`): a 2 MB program, a backtracking pattern against a host schema, a final
  value nested 100,000 deep, a 1.5 MB untrusted schema registration, a timer storm, tool
  calls smuggled past the guest's pending count, an over-long tool-call id, a 4 MB tool
  input and a 4 MB tool output, a final value just within a 10 MiB output budget, tool
  inputs nested 3,000 and 100,000 deep, a caught out-of-memory error, and three controller
  tamperings (``Object.freeze(globalThis)``, a throwing getter on
  ``Promise.prototype.constructor``, a throwing ``Error[Symbol.hasInstance]``).

A normal exec is ``return 1`` after one nested call. Prints the normal execs' p50/p99 (ms)
for each phase with the load average, the noisy phase's p99 against both baselines, what
each hostile class got, and the RSS of the service's process tree (the service and all its
worker processes) at the start (after a warm-up that fills the pool and starts both lanes of
the CPU worker pool) and at the end, each after 7 s idle (past one periodic sweep, after
which the service returns freed heap to the system).

``BENCH_NORMAL_EXECS`` sets each normal client's exec count (default 6); ``BENCH_HOSTILE``
keeps only the named hostile classes; ``BENCH_AB`` (``NAME=VALUE,...``, variants separated
by ``;``) measures more services with those settings beside this one, phase by phase.
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
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
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
BIG = Tool(source="host", owner="core", name="big")
#: A multi-MB tool input and tool output; the largest output budget and a final value just within it.
BIG_BYTES = 4 * 1024 * 1024
MAX_OUTPUT_BYTES = 10 * 1024 * 1024
NEAR_LIMIT_BYTES = MAX_OUTPUT_BYTES - 1024
#: ``BENCH_HOSTILE``: only these hostile classes (comma-separated names), e.g. to find the costliest one.
#: Seconds idle before each RSS reading: past one periodic sweep (5 s), after which the service returns freed heap.
IDLE_S = 7.0
#: ``BENCH_AB``: settings (``NAME=VALUE,...``) of more services measured beside this one, phase by phase
#: (A/B), one per ``;``-separated variant.
AB = os.environ.get("BENCH_AB", "")
HOSTILE = {c.strip() for c in os.environ.get("BENCH_HOSTILE", "").split(",") if c.strip()}
WIDE = {"type": "object", "properties": {f"p{i}": {"type": "string", "description": "x" * 20} for i in range(20_000)}}


async def echo(tool_input: Any, call: Any) -> Any:
    return {"details": tool_input}


async def big_reply(tool_input: Any, call: Any) -> Any:
    """A tool output of :data:`BIG_BYTES` characters (a multi-MB ToolResult towards the guest)."""
    return {"s": "x" * BIG_BYTES}


def percentile(samples: list[float], q: float) -> float:
    """The q-quantile (0..1) of samples by nearest rank."""
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def rss_mib(pid: int) -> float:
    """Resident set size of one process, MiB (0 once it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def process_tree(pid: int) -> list[int]:
    """``pid`` and all its descendants (the CPU worker pool's processes and their helpers), parents first."""
    tree, i = [pid], 0
    while i < len(tree):
        for task in Path(f"/proc/{tree[i]}/task").glob("*"):
            try:
                tree.extend(int(c) for c in (task / "children").read_text().split())
            except OSError:
                continue
        i += 1
    return tree


def tree_rss_mib(pid: int) -> tuple[float, list[int]]:
    """The summed RSS (MiB) of the service process and all its descendants, and each one's (rounded)."""
    each = [rss_mib(p) for p in process_tree(pid)]
    return sum(each), [round(m) for m in each]


async def normal_client(client: CellblockClient, n: int, samples: list[float]) -> None:
    scope = Scope(f"normal-{n}", "bench")
    await client.put_catalog(scope, [ECHO])
    for i in range(NORMAL_EXECS):
        started = time.perf_counter()
        result = await client.exec(scope, tool_call_id=f"n{n}-{i}", code=NORMAL, handlers={"echo": echo})
        samples.append((time.perf_counter() - started) * 1000)
        assert result.status == "completed" and result.value == 1, result.raw_json


async def wide_and_gone(client: CellblockClient, n: int) -> str:
    """Registers a 1.5 MB untrusted schema in a scope of its own, then ends that scope (no state kept)."""
    scope = Scope(f"hostile-{n}-wide", "bench")
    try:
        await client.put_catalog(scope, [Tool(source="mcp", owner="wide", name="w", parameters=WIDE)])
    finally:
        await client.delete_catalog(scope)
    return "registered"


#: Hostile programs by class (issue 11's items; the tamperings of item 5 each before a tool call and a value).
DEEP_VALUE = "let v = 0; for (let i = 0; i < 100000; i++) v = [v]; return v;"
REGEX = 'for (let n = 20; n < 30; n++) { try { await tools.callValue("host:core:match", {s: "a".repeat(n) + "!"}); } catch (e) {} } return 1;'
SMUGGLE = 'let k = 0; const a = { toJSON() { if (k++ < 40) tools.callValue("host:core:echo", a).catch(() => {}); return {}; } }; try { await tools.callValue("host:core:echo", a); } catch (e) {} return 1;'
STORM = "for (let i = 0; i < 3000; i++) { try { setTimeout(() => {}, 1); } catch (e) {} } return 1;"
BIG_INPUT = f'const r = await tools.callValue("host:core:echo", {{s: "x".repeat({BIG_BYTES})}}); return r.s.length;'
BIG_OUTPUT = 'const r = await tools.callValue("host:core:big", {}); return r.s.length;'
NEAR_LIMIT = f'return "x".repeat({NEAR_LIMIT_BYTES});'
DEEP_INPUT = 'for (const depth of [3000, 100000]) { let v = 0; for (let i = 0; i < depth; i++) v = [v]; try { await tools.callValue("host:core:echo", {v}); } catch (e) {} } return 1;'
CAUGHT_OOM = 'const keep = []; try { for (;;) keep.push("x".repeat(1 << 20) + keep.length); } catch (e) {} return keep.length;'
USE_AFTER = ' const r = await tools.callValue("host:core:echo", {n: 1}); setTimeout(() => {}, 1); return r;'
TAMPER = {
    "frozen globalThis": "Object.freeze(globalThis);" + USE_AFTER,
    "throwing Promise constructor getter": "Object.defineProperty(Promise.prototype, 'constructor', { get() { throw new Error('tampered'); } });" + USE_AFTER,
    "throwing Error[Symbol.hasInstance]": "Object.defineProperty(Error, Symbol.hasInstance, { value() { throw new Error('tampered'); } });" + USE_AFTER,
}


def attacks(client: CellblockClient, n: int, scope: Scope) -> list[tuple[str, Callable[[], Awaitable[Any]]]]:
    """The hostile client's requests, one per class, each a fresh call."""
    handlers = {"echo": echo, "big": big_reply}

    def run(code: str, **kwargs: Any) -> Callable[[], Awaitable[Any]]:
        return lambda: client.exec(scope, tool_call_id="h", code=code, handlers=handlers, **kwargs)

    one_pending = LimitOverrides(max_pending_tool_calls=1)
    return [
        ("huge program", run("a;" * (1024 * 1024))),
        ("backtracking pattern", run(REGEX)),
        ("deep value", run(DEEP_VALUE)),
        ("huge untrusted schema", lambda: wide_and_gone(client, n)),
        ("timer storm", run(STORM, limits=one_pending)),
        ("smuggled calls", run(SMUGGLE, limits=one_pending)),
        ("long id", lambda: client.exec(scope, tool_call_id="x" * 1_000_000, code="return 1", handlers={})),
        ("big tool input", run(BIG_INPUT)),
        ("big tool output", run(BIG_OUTPUT)),
        ("final value near the limit", run(NEAR_LIMIT, limits=LimitOverrides(max_output_bytes=MAX_OUTPUT_BYTES))),
        ("deep tool input", run(DEEP_INPUT)),
        ("caught out of memory", run(CAUGHT_OOM)),
        *((name, run(code)) for name, code in TAMPER.items()),
    ]


def outcome(answer: Any) -> str:
    """What one hostile request got: ``completed``, ``failed/<code>``, a catalog answer or an RPC status."""
    if isinstance(answer, str):
        return answer
    # internal_error is also the program's own uncaught error (SPEC §11.3 item 4), runtime_unavailable covers
    # memory, engine traps and cell faults: the text's start tells them apart.
    text = f" ({(answer.error or '')[:36]!r})" if answer.code in ("internal_error", "runtime_unavailable") else ""
    return answer.status + (f"/{answer.code}" if answer.code else "") + text


async def hostile_client(client: CellblockClient, n: int, stop: asyncio.Event, outcomes: dict[str, Counter[str]]) -> None:
    scope = Scope(f"hostile-{n}", "bench")
    await client.put_catalog(scope, [ECHO, MATCH, BIG])
    requests = [a for a in attacks(client, n, scope) if not HOSTILE or a[0] in HOSTILE]
    i = n * 2  # the clients start on different classes, so a short phase still sees most of them
    while not stop.is_set():
        name, attack = requests[i % len(requests)]
        i += 1
        try:
            answer = outcome(await attack())
        except CellblockError as exc:
            answer = f"rpc {type(exc).__name__}"
        outcomes.setdefault(name, Counter())[answer] += 1


async def phase(address: str, hostile: int, normal: int = CLIENTS) -> tuple[list[float], dict[str, Counter[str]]]:
    """One phase: ``normal`` normal clients beside ``hostile`` hostile ones; the normal execs' latencies (ms)."""
    samples: list[float] = []
    outcomes: dict[str, Counter[str]] = {}
    stop = asyncio.Event()
    async with await CellblockClient.connect(address) as client:
        attackers = [asyncio.ensure_future(hostile_client(client, n, stop, outcomes)) for n in range(hostile)]
        await asyncio.gather(*(normal_client(client, n, samples) for n in range(normal)))
        stop.set()
        await asyncio.gather(*attackers)
    return samples, outcomes


async def start_workers(address: str) -> None:
    """Starts both lanes of the service's CPU worker pool (a large program, a large schema) before RSS is read."""
    async with await CellblockClient.connect(address) as client:
        scope = Scope("warm-up", "bench")
        await client.put_catalog(scope, [ECHO])
        await client.exec(scope, tool_call_id="w", code="a;" * (64 * 1024), handlers={})
        await wide_and_gone(client, -1)
        await client.delete_catalog(scope)


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


def loadavg() -> str:
    """The machine's 1-minute load average now (the bench shares its cores)."""
    return f"{os.getloadavg()[0]:.1f}"


#: The phases: name, hostile clients, normal clients.
PHASES = (("quiet (16 normal)", 0, CLIENTS), ("alone (8 normal)", 0, CLIENTS // 2), ("noisy (8 normal + 8 hostile)", CLIENTS // 2, CLIENTS // 2))


@dataclass
class Service:
    """One service process under test, its settings and what was measured on it."""

    name: str
    settings: dict[str, str]
    proc: subprocess.Popen[bytes] | None = None
    address: str = ""
    samples: dict[str, list[float]] = field(default_factory=dict)
    loads: dict[str, str] = field(default_factory=dict)
    outcomes: dict[str, Counter[str]] = field(default_factory=dict)
    rss: list[tuple[float, list[int]]] = field(default_factory=list)

    def start(self, sockets: str) -> None:
        """Starts ``python -m cellblock.server`` with its own socket and state directories."""
        self.address = f"127.0.0.1:{_free_port()}"
        # Latency is measured, not the busy bound: on a loaded machine 16 cell starts at once
        # can take longer than the default 10 s cell wait.
        wait = {"CELLBLOCK_CELL_WAIT_MS": os.environ.get("CELLBLOCK_CELL_WAIT_MS", "60000")}
        env = service_env(self.address, sockets, IMAGE, timeout_ms=5000, **{**wait, **self.settings})
        self.proc = subprocess.Popen([sys.executable, "-m", "cellblock.server"], env=env, stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL)  # noqa: S603

    def stop(self) -> None:
        """Stops the service (SIGTERM) and waits for it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=60)

    def report(self) -> None:
        """Prints this service's table, ratios, hostile outcomes and RSS."""
        quiet, alone, noisy = (self.samples[name] for name, *_ in PHASES)
        print(f"noisy neighbour [{self.name}]: {CLIENTS} clients, {NORMAL_EXECS} normal execs per normal client (ms)")
        print(f"{'phase':34} {'execs':>6} {'p50':>9} {'p99':>9} {'load avg':>9}")
        for name, *_ in PHASES:
            samples = self.samples[name]
            print(f"{name:34} {len(samples):6} {percentile(samples, 0.5):9.1f} {percentile(samples, 0.99):9.1f} {self.loads[name]:>9}")
        print(f"p99 ratio noisy/quiet (same 16-client load): {percentile(noisy, 0.99) / percentile(quiet, 0.99):.2f}x (issue 11 bound: 2x)")
        print(f"p99 ratio noisy/alone (same normal load): {percentile(noisy, 0.99) / percentile(alone, 0.99):.2f}x (issue 11 bound: 2x)")
        print(f"hostile requests: {sum(sum(c.values()) for c in self.outcomes.values())}")
        for name, counts in sorted(self.outcomes.items()):
            print(f"  {name:34} {', '.join(f'{answer} x{n}' for answer, n in counts.most_common())}")
        (start, each_start), (end, each_end) = self.rss
        print(
            f"service RSS (the service process and all its worker processes, {IDLE_S:g} s idle): start {start:.0f} MiB {each_start},"
            f" end {end:.0f} MiB {each_end} (delta {end - start:+.0f} MiB; issue 11 bound: 50 MiB)"
        )


def services() -> list[Service]:
    """The service under test, and with ``BENCH_AB`` (``NAME=VALUE,...;...``) one more per variant with those settings."""
    under_test = [Service("this build", {})]
    for variant in filter(None, AB.split(";")):
        under_test.append(Service(variant, dict(kv.split("=", 1) for kv in variant.split(","))))
    return under_test


async def main() -> None:
    under_test = services()
    with tempfile.TemporaryDirectory(prefix="cellblock-noisy-") as sockets:
        try:
            for i, service in enumerate(under_test):
                service.start(os.path.join(sockets, str(i)))
            for service in under_test:
                assert service.proc is not None
                await _ready(service.address, service.proc)
                await phase(service.address, 0)  # warm-up: the pool filled
                await start_workers(service.address)
            await asyncio.sleep(IDLE_S)
            for service in under_test:
                assert service.proc is not None
                service.rss.append(tree_rss_mib(service.proc.pid))
            started_load = loadavg()
            # Interleaved: each phase runs on every service before the next phase starts.
            for name, hostile, normal in PHASES:
                for service in under_test:
                    service.samples[name], outcomes = await phase(service.address, hostile, normal)
                    service.loads[name] = loadavg()
                    service.outcomes.update(outcomes)
            await asyncio.sleep(IDLE_S)
            for service in under_test:
                assert service.proc is not None
                service.rss.append(tree_rss_mib(service.proc.pid))
        finally:
            for service in under_test:
                service.stop()
    print(f"load average (1 min) at the start: {started_load}; each row gives it at the row's end")
    for service in under_test:
        service.report()


if __name__ == "__main__":
    asyncio.run(main())
