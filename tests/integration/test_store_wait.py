"""The store wait bounds every run-store call an exec or wait answer depends on (SPEC §16.1 item 9, issue 11 item 6).

A real service (Docker cells) on a real store that stops answering: a SQLite file whose
write lock another connection holds, or a PostgreSQL cluster whose processes are
SIGSTOPped. A ``wait`` (its claim) answers [R26] and an ``exec`` (its slot) [R25],
``runtime_unavailable``, within the store wait plus slack, not when the store comes back.
Once it does, the calls that outlived their wait end in the background and are undone:
the parked run is suspended again and resumable, the failed exec holds no slot, the
counts are back to their baseline and the store is consistent.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import ExitStack, asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import pytest

from cellblock.client import CellblockClient, RunResult, Scope, Tool
from cellblock.server import messages as msg
from cellblock.server.app import ServerSettings, Service, start_service
from tests.support.cells import IMAGE, OCI_RUNTIME
from tests.support.postgres import Cluster

pytestmark = pytest.mark.asyncio(loop_scope="session")

STORE_CALL_MS = 1000
#: The answer's bound: the leg's sweep and the unanswered call (a store wait each) plus its other steps (a pooled cell, the guest's yield).
ANSWER_S = 6.0
TOOLS = [Tool(source="client", owner="app", name="noop", description="Unused.", parameters={"type": "object"})]
YIELD = 'const r = await yield_control("checkpoint"); return r;'
#: The run holds its slot (its first dispatch), then parks: the store stalls in between (the tool's handler).
CALL_THEN_YIELD = 'const a = await tools.callValue("client:app:noop", {}); await yield_control("checkpoint"); return a;'


@asynccontextmanager
async def _service(store: str) -> AsyncIterator[Service]:
    socket_dir = tempfile.mkdtemp(prefix="cellblock-storewait-")
    settings = ServerSettings(
        address="127.0.0.1:0", executor="docker", image=IMAGE, oci_runtime=OCI_RUNTIME, warm_pool=1, code_mode={"enabled": True, "timeoutMs": 8000},
        socket_dir=socket_dir, state_dir=os.path.join(socket_dir, "state"), store=store, store_call_ms=STORE_CALL_MS, lease_seconds=3.0,
    )
    svc = await start_service(settings)
    try:
        yield svc
    finally:
        await svc.stop()


async def _timed(call: Any) -> tuple[RunResult, float]:
    started = time.monotonic()
    result = await asyncio.wait_for(call, timeout=20.0)
    return result, time.monotonic() - started


async def _scenario(svc: Service, stalled: Callable[[], Any], n: int) -> None:
    registry = svc.registry
    scope = Scope(session_id=f"storewait-{os.getpid()}-{n}", agent_run_id="agent")
    async with await CellblockClient.connect(svc.address) as client:
        await client.put_catalog(scope, TOOLS)
        assert await registry.store.counts() == (0, 0)
        first = await client.exec(scope, tool_call_id="t1", code=YIELD)
        assert first.status == "waiting" and first.run_id
        assert await registry.store.counts() == (1, 1)

        with stalled():  # the claim of a wait
            refused, took = await _timed(client.wait(scope, tool_call_id="w1", run_id=first.run_id))
        assert refused.status == "failed" and refused.code == "runtime_unavailable", refused
        assert refused.error == msg.R26 and took < ANSWER_S, (refused.error, took)

        with stalled():  # an exec's first suspension: its slot and park, one store write
            failed, took = await _timed(client.exec(scope, tool_call_id="t2", code=YIELD))
        assert failed.status == "failed" and failed.code == "runtime_unavailable", failed
        assert failed.error == msg.R25 and took < ANSWER_S, (failed.error, took)

        # The store answers again: what outlived its wait is finished and undone.
        await asyncio.wait_for(registry.calls.drain(), timeout=30.0)
        assert registry.calls.late == 0
        assert await registry.store.counts() == (1, 1)  # only the parked run, suspended again
        assert await registry.store.check_integrity() == []
        resumed = await client.wait(scope, tool_call_id="w2", run_id=first.run_id)
        assert resumed.status == "completed" and resumed.value == {"status": "yielded", "reason": "checkpoint"}, resumed
        assert await registry.store.counts() == (0, 0)
        assert registry.active == {}

        # A park the store does not answer: never `waiting`; the late park is undone.
        with ExitStack() as stall:

            async def noop(tool_input: dict[str, Any], call: Any) -> dict[str, Any]:
                stall.enter_context(stalled())
                return {"details": {"ok": True}}

            unparked, took = await _timed(client.exec(scope, tool_call_id="t3", code=CALL_THEN_YIELD, handlers={"noop": noop}))
        assert unparked.status == "failed" and unparked.code == "runtime_unavailable", unparked
        assert unparked.error == msg.R25 and took < ANSWER_S + 2.0, (unparked.error, took)
        await asyncio.wait_for(registry.calls.drain(), timeout=30.0)
        assert await registry.store.counts() == (0, 0)
        assert await registry.store.check_integrity() == []


async def test_a_sqlite_store_locked_by_another_connection_answers_r26_and_r25_within_the_store_wait(tmp_path: Path) -> None:
    path = tmp_path / "runs.sqlite3"

    @contextmanager
    def locked() -> Iterator[None]:
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("BEGIN EXCLUSIVE")  # every writer (each store call begins IMMEDIATE) waits
        try:
            yield
        finally:
            other.execute("ROLLBACK")
            other.close()

    async with _service("sqlite:///" + str(path).lstrip("/")) as svc:
        await _scenario(svc, locked, 1)


def _cluster_pids(cluster: Cluster) -> list[int]:
    postmaster = int(Path(cluster.data_dir, "postmaster.pid").read_text().split()[0])
    children = subprocess.run(["pgrep", "-P", str(postmaster)], capture_output=True, text=True, check=False).stdout.split()
    return [postmaster, *map(int, children)]


async def test_a_sigstopped_postgresql_answers_r26_and_r25_within_the_store_wait(pg_cluster: Cluster) -> None:
    dsn = pg_cluster.database(f"storewait_{os.getpid()}")

    @contextmanager
    def stopped() -> Iterator[None]:
        pids = _cluster_pids(pg_cluster)  # the server and every backend: no statement is answered
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        try:
            yield
        finally:
            for pid in pids:
                os.kill(pid, signal.SIGCONT)

    async with _service(dsn) as svc:
        await _scenario(svc, stopped, 2)
