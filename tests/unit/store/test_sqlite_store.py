"""The SQLite run store's own mechanics (SPEC §16.1): one hop per operation, and what each commit makes durable.

Every operation runs whole on the store's thread (one loop-to-thread hop, not
one per statement). Parks, removals, releases and cancellations commit at
``synchronous=FULL`` (durable across power loss); claims, lease renewals and
slot reservations at ``synchronous=NORMAL``: durable across a crash of any
process, which the SIGKILL test below shows for a claim.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from cellblock.server.store import Park, SqliteRunStore
from cellblock.server.store._base import snapshot_digest

pytestmark = pytest.mark.asyncio(loop_scope="session")
LEASE = 5.0


def _park(run_id: str, data: bytes = b"snapshot" * 100) -> Park:
    return Park(run_id, "s", "a", 1.0, b'{"v":1}', data, "build", 3600.0)


async def _open(tmp_path: Path) -> SqliteRunStore:
    store = SqliteRunStore(str(tmp_path / "runs.sqlite3"), 8)
    await store.open()
    return store


async def test_every_operation_is_one_hop_to_the_store_thread(tmp_path: Path) -> None:
    store = await _open(tmp_path)
    loop = asyncio.get_running_loop()
    hops: list[str] = []
    real = loop.run_in_executor

    def counted(executor: Any, fn: Any, *args: Any) -> Any:
        hops.append(getattr(fn, "__name__", "?"))
        return real(executor, fn, *args)

    loop.run_in_executor = counted  # type: ignore[method-assign]
    try:
        per_operation = []
        for operation in (
            lambda: store.reserve_slot("run_1", "s", "a", 1.0, "t1", LEASE),
            lambda: store.park(_park("run_1"), "t1"),
            store.sweep,
            store.counts,
            store.sweep_and_count,
            lambda: store.claim("run_1", "s", "a", "t2", LEASE),
            lambda: store.renew("run_1", "t2", LEASE),
            lambda: store.remove("run_1", "t2"),
        ):
            hops.clear()
            await operation()
            per_operation.append(len(hops))
    finally:
        loop.run_in_executor = real  # type: ignore[method-assign]
    assert per_operation == [1] * 8
    await store.close()


async def test_claims_renewals_and_reservations_skip_the_fsync_and_every_other_write_keeps_it(tmp_path: Path) -> None:
    store = await _open(tmp_path)
    statements: list[str] = []
    assert store._conn is not None
    store._conn.set_trace_callback(statements.append)

    async def level_of(operation: Any) -> str:
        statements.clear()
        await operation()
        begin = statements.index("BEGIN IMMEDIATE")
        pragmas = [s for s in statements[:begin] if s.startswith("PRAGMA synchronous")]
        return pragmas[-1].split("=")[1] if pragmas else "FULL"  # the connection's own setting

    levels = {
        "reserve": await level_of(lambda: store.reserve_slot("run_1", "s", "a", 1.0, "t1", LEASE)),
        "park": await level_of(lambda: store.park(_park("run_1"), "t1")),
        "claim": await level_of(lambda: store.claim("run_1", "s", "a", "t2", LEASE)),
        "renew": await level_of(lambda: store.renew("run_1", "t2", LEASE)),
        "release": await level_of(lambda: store.release("run_1", "t2")),
        "claim again": await level_of(lambda: store.claim("run_1", "s", "a", "t3", LEASE)),
        "remove": await level_of(lambda: store.remove("run_1", "t3")),
        "cancel": await level_of(lambda: store.cancel("run_2", "s", "a", 10.0)),
    }
    assert levels == {
        "reserve": "NORMAL",
        "park": "FULL",
        "claim": "NORMAL",
        "renew": "NORMAL",
        "release": "FULL",
        "claim again": "NORMAL",
        "remove": "FULL",
        "cancel": "FULL",
    }
    # And the connection is back at FULL after each: a later park is host-durable.
    store._conn.set_trace_callback(None)
    assert await store.call(lambda c: c.execute("PRAGMA synchronous").fetchone()[0]) == 2  # FULL
    await store.close()


@pytest.mark.timeout(60)
async def test_a_claim_survives_the_sigkill_of_its_process(tmp_path: Path) -> None:
    # A process parks a run, claims it and is killed at once (no close, no later commit):
    # the claim, committed without an fsync of its own, is still in the store, so the run
    # is busy, and once its lease lapses it is taken over from its last park (SPEC §16.1 item 6).
    path = tmp_path / "runs.sqlite3"
    child = textwrap.dedent(
        f"""
        import asyncio, os, signal, sys
        from cellblock.server.store import Park, SqliteRunStore
        async def main():
            s = SqliteRunStore({str(path)!r}, 8)
            await s.open()
            assert await s.reserve_slot("run_k", "s", "a", 1.0, "t1", 60.0)
            assert await s.park(Park("run_k", "s", "a", 1.0, b'{{"v":1}}', b"snap" * 1000, "build", 3600.0), "t1") is not None
            claim = await s.claim("run_k", "s", "a", "t-killed", 1.0)
            assert claim.status == "claimed"
            print("claimed", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        asyncio.run(main())
        """
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, env=env, timeout=50)
    assert done.returncode == -signal.SIGKILL and done.stdout.strip() == "claimed", done.stderr
    store = await _open(tmp_path)
    record = await store.get("run_k")
    assert record is not None and record.state == "active" and record.lease_token == "t-killed"
    assert (await store.claim("run_k", "s", "a", "t-next", LEASE)).status == "busy"
    await asyncio.sleep(1.1)  # the killed claim's 1 s lease lapses
    taken = await store.claim("run_k", "s", "a", "t-next", LEASE)
    assert taken.status == "claimed" and taken.taken_over and taken.record is not None and taken.record.snapshot == b"snap" * 1000
    assert await store.check_integrity() == []
    await store.close()


async def test_a_wait_cancelled_while_the_store_claims_gives_the_run_back(tmp_path: Path) -> None:
    # The store's claim runs whole on its thread: once running there it commits even when its
    # wait is cancelled meanwhile. The registry gives such a claim back, so the run is suspended
    # again at once (not busy, [W06], until the lost lease lapses). Another connection holds the
    # write lock, so the claim is running (waiting in its BEGIN) when the wait is cancelled.
    import sqlite3

    from cellblock.server.runs import RunRegistry

    path = str(tmp_path / "runs.sqlite3")
    store = SqliteRunStore(path, 8)
    await store.open()
    assert await store.reserve_slot("run_c", "s", "a", 1.0, "t1", LEASE)
    assert await store.park(_park("run_c"), "t1") is not None
    registry = RunRegistry(store, lease_seconds=60.0)
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    task = asyncio.ensure_future(registry.claim("run_c", "s", "a"))
    await asyncio.sleep(0.2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    other.execute("COMMIT")
    other.close()
    await store.counts()  # queued behind the claim on the store's thread: the claim has committed
    await asyncio.sleep(0.3)  # the give-back (one more operation) is done well within this
    record = await store.get("run_c")
    assert record is not None and record.state == "suspended" and record.lease_token is None, record
    assert (await store.claim("run_c", "s", "a", "t-next", LEASE)).status == "claimed"
    assert await store.check_integrity() == []
    await store.close()


async def test_a_claim_and_a_removal_write_a_few_pages_not_the_snapshot(tmp_path: Path) -> None:
    # The snapshot's pages are written once, by its park. A claim rewrites the run's row, which
    # no longer holds the snapshot (migration 0002; inline, each claim rewrote its overflow pages),
    # and a removal frees its pages without zeroing them (secure_delete=FAST; the ON default of
    # some SQLite builds zeroed each freed page in the same transaction): a few WAL frames each,
    # not the snapshot's, for the next FULL commit to sync.
    snapshot = os.urandom(200_000)  # incompressible: about 49 overflow pages of 4 KiB
    pages = len(snapshot) // 4096
    store = await _open(tmp_path)
    wal = Path(store.path + "-wal")

    async def frames_of(operation: Any) -> int:
        await store.call(lambda c: c.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone())
        assert wal.stat().st_size == 0
        await operation()
        return (wal.stat().st_size - 32) // (4096 + 24)  # WAL header, then one header + page per frame

    assert await store.reserve_slot("run_1", "s", "a", 1.0, "t1", LEASE)
    park_frames = await frames_of(lambda: store.park(_park("run_1", snapshot), "t1"))
    claimed: list[Any] = []
    claim_frames = await frames_of(lambda: _append(claimed, store.claim("run_1", "s", "a", "t2", LEASE)))
    remove_frames = await frames_of(lambda: store.remove("run_1", "t2"))
    assert claimed[0].status == "claimed" and claimed[0].record.snapshot == snapshot
    assert park_frames >= pages and claim_frames < 10 and remove_frames < 10, (park_frames, claim_frames, remove_frames)
    assert await store.get("run_1") is None and await store.check_integrity() == []
    await store.close()


async def _append(into: list[Any], value: Any) -> None:
    into.append(await value)


async def test_a_run_parked_under_schema_1_keeps_its_snapshot_through_migration_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A store written before migration 0002 (the snapshot inline in its run's row): its parked
    # run is claimed with the same snapshot after the upgrade, and removed with it.
    import shutil
    import sqlite3

    from cellblock.server.store import _sql

    old = tmp_path / "migrations" / "sqlite"
    old.mkdir(parents=True)
    shutil.copy(_sql.MIGRATIONS / "sqlite" / "0001_runs.sql", old)
    with monkeypatch.context() as patch:
        patch.setattr(_sql, "MIGRATIONS", tmp_path / "migrations")
        store = await _open(tmp_path)
        await store.close()
    snapshot = os.urandom(50_000)
    conn = sqlite3.connect(tmp_path / "runs.sqlite3", isolation_level=None)
    conn.execute(
        "INSERT INTO cellblock_runs (run_id, session_id, agent_run_id, state, created_at, expires_at, holds_slot, generation, body, snapshot, "
        "snapshot_size, snapshot_sha256, snapshot_placement, engine_build_id, lease_token, lease_until, updated_at) "
        "VALUES ('run_old', 's', 'a', 'suspended', 1.0, 1e12, 1, 1, ?, ?, ?, ?, 'inline', 'build', NULL, 0, 1.0)",
        (b'{"v":1}', snapshot, len(snapshot), snapshot_digest(snapshot)),
    )
    conn.close()
    store = await _open(tmp_path)
    assert await store.check_integrity() == []
    claim = await store.claim("run_old", "s", "a", "t2", LEASE)
    assert claim.status == "claimed" and claim.record is not None and claim.record.snapshot == snapshot
    assert await store.remove("run_old", "t2")
    assert await store.call(lambda c: c.execute("SELECT count(*) FROM cellblock_snapshots").fetchone()[0]) == 0
    assert await store.check_integrity() == []
    await store.close()


async def test_a_sweep_drops_the_snapshot_of_every_run_it_frees_in_chunks(tmp_path: Path) -> None:
    # The sweep deletes the swept runs' snapshots 500 ids a statement (a sweep may free more runs
    # than a statement may bind): 1001 expired parks, three statements, leave none.
    store = SqliteRunStore(str(tmp_path / "runs.sqlite3"), 2000)  # one scope may hold 1500
    await store.open()
    for i in range(1001):
        assert await store.reserve_slot(f"run_{i}", "s", "a", 1.0, "t", LEASE)
        assert await store.park(Park(f"run_{i}", "s", "a", 1.0, b'{"v":1}', b"snap", "build", 0.0), "t") is not None
    assert len(await store.sweep()) == 1001
    assert await store.call(lambda c: c.execute("SELECT count(*) FROM cellblock_snapshots").fetchone()[0]) == 0
    assert await store.counts() == (0, 0) and await store.check_integrity() == []
    await store.close()
