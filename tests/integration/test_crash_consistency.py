"""Crash consistency of parking (SPEC §16.1 item 2): SIGKILL at random points while runs park.

Each round, a real service process resumes every known run (each re-parks one
step further) and starts a new one, and is SIGKILLed after a random delay:
before, during or after cell starts, snapshots and store transactions. A new
process then opens the same store. Checked every round: the store's integrity
check passes; every run is in its previous state or its new one (the record's
park generation is the last confirmed one or the next, never lost, never
half-written); and a wait on each run resumes exactly from that recorded state
(the guest's step counter, kept only in the snapshot, equals the generation).
A short sample runs in `make test`; `make test-long` repeats 50 times per store.
"""

from __future__ import annotations

import asyncio
import os
import random
import time

import pytest

from cellblock.client import CellblockClient, LimitOverrides, RunResult, Scope
from cellblock.server.store import RunStore, make_run_store
from tests.integration.test_run_store_restart import FAST_RECONNECT, TOOLS
from tests.support.service_process import ServiceProcess, remove_cells_of

pytestmark = pytest.mark.asyncio(loop_scope="session")

LONG = os.environ.get("CELLBLOCK_TEST_LONG") == "1"
REPEATS = int(os.environ.get("CELLBLOCK_CRASH_REPEATS", "50" if LONG else "3"))
#: Runs kept alive at once (the oldest is cancelled beyond this).
KEEP = 4
STEP = 'let i = 0; for (;;) { i++; console.log("step " + i); await yield_control(); }'
LIMITS = LimitOverrides(timeout_ms=6000)
W06 = "this run is already being resumed by another wait; let that call return first."
W03 = "this run is unknown or has expired; start a new exec instead of waiting."


async def _catalog_when_up(client: CellblockClient, scope: Scope) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            await client.put_catalog(scope, TOOLS)
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.3)


async def _wait_step(client: CellblockClient, scope: Scope, run_id: str, name: str) -> tuple[RunResult, list[str]]:
    """One wait that resumes the run; retried while a dead replica's lease still holds it."""
    deadline = time.monotonic() + 30
    while True:
        outputs: list[str] = []
        result = await client.wait(scope, tool_call_id=name, run_id=run_id, on_output=lambda e, out=outputs: out.append(e.text))
        if result.error != W06 or time.monotonic() > deadline:
            return result, outputs
        await asyncio.sleep(0.5)


async def test_sigkill_at_random_points_while_runs_park(durable_store_url: str, process_sockets: str) -> None:
    seed = int(os.environ.get("CELLBLOCK_CRASH_SEED", str(int(time.time()))))
    rng = random.Random(seed)
    scope = Scope(session_id="crash", agent_run_id="agent")
    store: RunStore = make_run_store(durable_store_url, 64)
    await store.open()
    env = {"CELLBLOCK_STORE_LEASE_S": "2"}
    svc = ServiceProcess(durable_store_url, process_sockets, env=env).start()
    known: dict[str, int] = {}  # run id -> confirmed park generation (== the guest's step counter)
    outcomes = {"previous": 0, "new": 0, "exec_replied": 0, "exec_parked_unreplied": 0, "exec_reserved_only": 0, "exec_not_stored": 0}
    try:
        async with await CellblockClient.connect(svc.address, channel_options=FAST_RECONNECT) as client:
            await _catalog_when_up(client, scope)
            # Calibrate: how long one park takes here (cell start, run, snapshot, store), so
            # the kills land around parking: uniformly in [0.3, 2.5] x that duration.
            started = time.monotonic()
            warm = await client.exec(scope, tool_call_id="warm", code=STEP, handlers={}, limits=LIMITS)
            park_s = time.monotonic() - started
            assert warm.status == "waiting" and warm.run_id is not None, warm.raw_json
            known[warm.run_id] = 1
            for round_ in range(REPEATS):
                where = f"seed {seed}, round {round_}"
                # Activity: every known run steps (re-parks), one new run parks; kill at a random instant.
                activity = [asyncio.ensure_future(client.wait(scope, tool_call_id=f"r{round_}-{rid[-6:]}", run_id=rid)) for rid in known]
                activity.append(asyncio.ensure_future(client.exec(scope, tool_call_id=f"r{round_}-exec", code=STEP, handlers={}, limits=LIMITS)))
                await asyncio.sleep(rng.uniform(0.3, 2.5) * park_s)
                svc.kill()
                finished = await asyncio.gather(*activity, return_exceptions=True)
                new_exec = finished[-1]
                remove_cells_of(process_sockets)
                svc = ServiceProcess(durable_store_url, process_sockets, port=svc.port, env=env).start()
                await _catalog_when_up(client, scope)

                assert await store.check_integrity() == [], where
                for run_id, gen in known.items():
                    record = await store.get(run_id)
                    assert record is not None and record.state in ("suspended", "active"), f"{where}: {run_id} lost ({record})"
                    assert record.generation in (gen, gen + 1), f"{where}: {run_id} at generation {record.generation}, expected {gen} or {gen + 1}"
                    outcomes["new" if record.generation == gen + 1 else "previous"] += 1
                if isinstance(new_exec, RunResult) and new_exec.status == "waiting":
                    assert new_exec.run_id is not None
                    record = await store.get(new_exec.run_id)
                    assert record is not None and record.generation == 1, f"{where}: a waiting exec's run is stored"
                    known[new_exec.run_id] = 0
                    outcomes["exec_replied"] += 1
                else:
                    unknown = [r for r in await store.list_scope(scope.session_id, scope.agent_run_id) if r.run_id not in known]
                    # An exec killed before its reply: not stored, parked (generation 1), or a slot
                    # reservation whose leg died (no snapshot: never resumable, SPEC §16.1 item 6).
                    assert len(unknown) <= 1 and all(r.generation in (0, 1) for r in unknown), f"{where}: {unknown}"
                    outcomes["exec_not_stored" if not unknown else "exec_parked_unreplied" if unknown[0].generation else "exec_reserved_only"] += 1
                    for r in unknown:
                        known[r.run_id] = 0
                # Every run resumes exactly from its recorded state.
                checks = []
                for run_id in list(known):
                    record = await store.get(run_id)
                    gen = record.generation if record is not None else 0
                    checks.append((run_id, gen, asyncio.ensure_future(_wait_step(client, scope, run_id, f"r{round_}-check-{run_id[-6:]}"))))
                for run_id, gen, task in checks:
                    result, outputs = await task
                    if gen == 0:
                        assert result.error == W03, f"{where}: a run without a park is unknown ({result.raw_json})"
                        del known[run_id]
                        continue
                    assert result.status == "waiting", f"{where}: {result.raw_json}"
                    assert outputs == [f"step {gen + 1}"], f"{where}: {run_id} resumed from generation {gen} but printed {outputs}"
                    known[run_id] = gen + 1
                while len(known) > KEEP:
                    oldest = next(iter(known))
                    assert await client.cancel_run(scope, oldest) == "suspended"
                    del known[oldest]
                assert await store.check_integrity() == [], where
    finally:
        svc.kill()
        svc.close()
        await store.close()
    print(f"crash consistency ({durable_store_url.split(':')[0]}, seed {seed}, {REPEATS} rounds, park {park_s:.2f} s): {outcomes}")
