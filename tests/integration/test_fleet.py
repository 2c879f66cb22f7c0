"""Two real service processes on one PostgreSQL run store (SPEC §16.1 items 3-7).

Replica A and replica B are separate ``python -m cellblock.server`` processes
with Docker cells, sharing one throwaway PostgreSQL cluster. Proven here:
cross-replica resume, one wait at a time across replicas (a concurrent-wait
race, repeated), the suspended-run cap across both, expiry swept by the replica
that did not park the run, and a replica killed mid-leg whose lease lapses so
the other replica resumes the run from its last park with the lost leg's call
rejected with [R12].
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from cellblock.client import CellblockClient, LimitOverrides, Scope
from cellblock.server.store import make_run_store
from tests.integration.test_run_store_restart import FAST_RECONNECT, TOOLS, Gates
from tests.support.postgres import Cluster
from tests.support.service_process import ServiceProcess, remove_cells_of

pytestmark = pytest.mark.asyncio(loop_scope="session")

LIMITS = LimitOverrides(timeout_ms=4000)
#: Rounds of the concurrent-wait race: a short sample in `make test`, more in `make test-long`.
RACE_REPEATS = 40 if os.environ.get("CELLBLOCK_TEST_LONG") == "1" else 8
W06 = "this run is already being resumed by another wait; let that call return first."


@pytest.fixture
def fleet_store(pg_cluster: Cluster) -> str:
    return pg_cluster.database(f"fleet_{int(time.time() * 1000)}")


@pytest_asyncio.fixture(loop_scope="session")
async def fleet(fleet_store: str, process_sockets: str) -> AsyncIterator[tuple[ServiceProcess, ServiceProcess, CellblockClient, CellblockClient]]:
    env = {"CELLBLOCK_MAX_SUSPENDED_RUNS": "4", "CELLBLOCK_STORE_LEASE_S": "3"}
    a = ServiceProcess(fleet_store, process_sockets, env=env).start()
    # Replicas share the store, never a socket or state directory (each is locked, SPEC §16.2 item 5).
    b = ServiceProcess(fleet_store, os.path.join(process_sockets, "replica-b"), env=env).start()
    try:
        async with await CellblockClient.connect(a.address, channel_options=FAST_RECONNECT) as ca, await CellblockClient.connect(b.address) as cb:
            yield a, b, ca, cb
    finally:
        for p in (a, b):
            p.kill()
            p.close()


async def _both_catalogs(ca: CellblockClient, cb: CellblockClient, scope: Scope) -> None:
    # Catalogs are per replica: the runtime registers the scope's catalog on each.
    await ca.put_catalog(scope, TOOLS)
    await cb.put_catalog(scope, TOOLS)


async def test_exec_on_a_wait_on_b_and_listing_from_either(fleet: Any) -> None:
    a, b, ca, cb = fleet
    scope = Scope("fleet-s1", "agent")
    await _both_catalogs(ca, cb, scope)
    gates = Gates()
    gates.gate(8).set()
    code = 'console.log("on A"); const y = await yield_control(); console.log("on B"); const r = await tools.callValue("client:app:slow", {n: 8}); return [y.status, r.answer];'
    seen_a: list[str] = []
    first = await ca.exec(scope, tool_call_id="x1", code=code, handlers={"slow": gates}, limits=LIMITS, on_output=lambda e: seen_a.append(e.text))
    assert first.status == "waiting" and seen_a == ["on A"], first.raw_json
    listed = (await cb.list_runs(scope)).runs
    assert [r.run_id for r in listed] == [first.run_id] and listed[0].state == "suspended", "B lists A's run"
    assert (await cb.get_run(scope, first.run_id)).snapshot_bytes > 0
    seen_b: list[str] = []
    result = await cb.wait(scope, tool_call_id="x1-w", run_id=first.run_id, handlers={"slow": gates}, on_output=lambda e: seen_b.append(e.text))
    assert result.status == "completed", result.raw_json
    assert result.value == ["yielded", 8] and seen_b == ["on B"]
    assert [n for n, _ in gates.calls] == [8] and gates.calls[0][1].endswith("_1"), "B dispatched the run's first nested call"
    assert (await ca.list_runs(scope)).runs == []


async def test_two_waits_on_two_replicas_exactly_one_wins(fleet: Any) -> None:
    a, b, ca, cb = fleet
    scope = Scope("fleet-s2", "agent")
    await _both_catalogs(ca, cb, scope)
    for i in range(RACE_REPEATS):
        parked = await ca.exec(scope, tool_call_id=f"race{i}", code="const r = await yield_control(); return r.status;", handlers={}, limits=LIMITS)
        assert parked.status == "waiting", parked.raw_json
        one, two = await asyncio.gather(
            ca.wait(scope, tool_call_id=f"race{i}-a", run_id=parked.run_id),
            cb.wait(scope, tool_call_id=f"race{i}-b", run_id=parked.run_id),
        )
        outcomes = sorted([(one.status, one.error or one.value), (two.status, two.error or two.value)], key=str)
        assert outcomes == [("completed", "yielded"), ("failed", W06)], f"round {i}: {outcomes}"


async def test_the_cap_and_a_scopes_share_hold_across_both_replicas(fleet: Any) -> None:
    a, b, ca, cb = fleet
    scope, other = Scope("fleet-s3", "agent"), Scope("fleet-s3-other", "agent")
    await _both_catalogs(ca, cb, scope)
    await _both_catalogs(ca, cb, other)
    code = "const r = await yield_control(); return 1;"
    parked = [await c.exec(scope, tool_call_id=f"cap{i}", code=code, handlers={}, limits=LIMITS) for i, c in enumerate((ca, cb, ca))]
    assert [p.status for p in parked] == ["waiting"] * 3
    for c in (ca, cb):  # the scope holds its share (3 of 4), counted in the store shared by both replicas
        refused = await c.exec(scope, tool_call_id="cap-over", code=code, handlers={}, limits=LIMITS)
        assert (refused.status, refused.code) == ("failed", "runtime_unavailable")
        assert refused.error == "this scope already holds 3 of the deployment's 4 suspended-run slots, its most; wait on or cancel its waiting runs before starting new ones."
    theirs = await cb.exec(other, tool_call_id="cap-other", code=code, handlers={}, limits=LIMITS)
    assert theirs.status == "waiting", "the last quarter stays for another scope"
    for c in (ca, cb):  # the whole cap, filled by two scopes
        refused = await c.exec(other, tool_call_id="cap-full", code=code, handlers={}, limits=LIMITS)
        assert (refused.status, refused.code) == ("failed", "runtime_unavailable")
        assert refused.error == "too many runs are suspended or waiting on tools in this cellblock deployment (limit 4); finish waiting runs before starting new ones."
    done = await cb.wait(scope, tool_call_id="cap0-w", run_id=parked[0].run_id)
    assert done.status == "completed"
    again = await ca.exec(scope, tool_call_id="cap-after", code=code, handlers={}, limits=LIMITS)
    assert again.status == "waiting", "a freed slot is usable from the other replica"
    for p in [*parked[1:], again]:
        assert await ca.cancel_run(scope, p.run_id) == "suspended"
    assert await cb.cancel_run(other, theirs.run_id) == "suspended"


async def test_expiry_is_swept_by_the_replica_that_did_not_park(fleet: Any, fleet_store: str) -> None:
    a, b, ca, cb = fleet
    scope = Scope("fleet-s4", "agent")
    await _both_catalogs(ca, cb, scope)
    parked = await ca.exec(scope, tool_call_id="exp", code="await yield_control(); return 1;", handlers={}, limits=LimitOverrides(timeout_ms=4000, snapshot_ttl_seconds=2))
    assert parked.status == "waiting"
    a.stop()  # only B is left to sweep
    store = make_run_store(fleet_store, 4)
    await store.open()
    try:
        assert (await store.get(parked.run_id)) is not None
        await asyncio.sleep(2.5)
        deadline = time.monotonic() + 15
        while await store.get(parked.run_id) is not None:  # B's periodic sweep (every 5 s)
            assert time.monotonic() < deadline, "B never swept the expired run"
            await asyncio.sleep(0.5)
        assert await store.counts() == (0, 0), "the sweep freed the slot and the snapshot"
    finally:
        await store.close()
    assert f'"run_id": "{parked.run_id}"' in b.log_tail(20000) and "run.expired" in b.log_tail(20000)
    expired = await cb.wait(scope, tool_call_id="exp-w", run_id=parked.run_id)
    assert expired.error == "this run is unknown or has expired; start a new exec instead of waiting."


async def test_a_replica_killed_mid_leg_loses_the_leg_and_the_other_resumes_the_last_park(fleet: Any, process_sockets: str) -> None:
    a, b, ca, cb = fleet
    scope = Scope("fleet-s5", "agent")
    await _both_catalogs(ca, cb, scope)
    gates = Gates()
    code = """
    let first;
    try { first = (await tools.callValue("client:app:slow", {n: 1})).answer; } catch (e) { return "lost: " + e.message; }
    const second = await tools.callValue("client:app:slow", {n: 2});
    return [first, second.answer];
    """
    parked = await ca.exec(scope, tool_call_id="kill", code=code, handlers={"slow": gates}, limits=LimitOverrides(timeout_ms=8000))
    assert parked.status == "waiting"
    gates.gate(1).set()
    # A's wait resumes the run with call 1's result; the guest dispatches call 2 and A is killed mid-leg.
    leg = asyncio.ensure_future(ca.wait(scope, tool_call_id="kill-wa", run_id=parked.run_id, handlers={"slow": gates}))
    deadline = time.monotonic() + 20
    while not any(n == 2 for n, _ in gates.calls):
        assert time.monotonic() < deadline, "call 2 was never dispatched"
        await asyncio.sleep(0.1)
    a.kill()
    with pytest.raises(Exception):  # noqa: B017 - the stream breaks with the replica
        await leg
    busy = await cb.wait(scope, tool_call_id="kill-wb0", run_id=parked.run_id)
    assert busy.error == W06, "the dead replica's lease holds until it lapses"
    await asyncio.sleep(3.5)
    resumed = await cb.wait(scope, tool_call_id="kill-wb", run_id=parked.run_id)
    assert resumed.status == "completed", resumed.raw_json
    assert resumed.value == "lost: cell runtime unavailable: the cell exited with code 137.", "resumed from the last park; the lost leg's call answered with R12"
    remove_cells_of(process_sockets)
