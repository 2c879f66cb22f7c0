"""The run store's contract on every backend (SPEC §10.7, §16.1): parking, claims, leases, cap, expiry."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable

import pytest

from cellblock.server.store import Park, RunStore, SlotAnswer, StoreUnavailableError, make_run_store

pytestmark = pytest.mark.asyncio(loop_scope="session")
LEASE = 5.0


def _park(run_id: str, data: bytes = b"snap", ttl: float = 60.0, body: bytes = b'{"v":1}', scope: tuple[str, str] = ("s", "a")) -> Park:
    return Park(run_id, scope[0], scope[1], 1.0, body, data, "build-1", ttl)


async def _parked(store: RunStore, run_id: str, **kw: object) -> None:
    token = secrets.token_hex(8)
    assert await store.reserve_slot(run_id, "s", "a", 1.0, token, LEASE)
    assert await store.park(_park(run_id, **kw), token) is not None  # type: ignore[arg-type]


async def _two_handles(open_store: Callable[..., RunStore], cap: int = 8) -> tuple[RunStore, RunStore]:
    """Two handles on one store, as two replicas have (memory: has only one)."""
    a = open_store(cap=cap)
    await a.open()
    if a.kind == "memory":
        return a, a
    b = open_store(cap=cap)
    await b.open()
    return a, b


async def test_park_then_claim_returns_record_snapshot_and_build_id(store: RunStore) -> None:
    token = "t1"
    assert await store.reserve_slot("run_1", "s", "a", 1.0, token, LEASE)
    before = await store.now()
    data = bytes(range(256)) * 1000
    expires = await store.park(_park("run_1", data, ttl=90.0), token)
    assert expires is not None and before + 89 < expires < before + 92
    got = await store.get("run_1")
    assert got is not None and got.state == "suspended" and got.snapshot is None and got.snapshot_size == len(data) and got.generation == 1
    claim = await store.claim("run_1", "s", "a", "t2", LEASE)
    assert claim.status == "claimed" and not claim.taken_over
    assert claim.record is not None and claim.record.snapshot == data and claim.record.engine_build_id == "build-1" and claim.record.body == b'{"v":1}'
    assert claim.record.expires_at == expires
    assert (await store.claim("run_1", "s", "a", "t3", LEASE)).status == "busy"
    assert await store.remove("run_1", "t2")
    assert (await store.claim("run_1", "s", "a", "t3", LEASE)).status == "missing"
    assert await store.counts() == (0, 0)


async def test_claim_checks_scope_and_release_gives_the_run_back_unchanged(store: RunStore) -> None:
    await _parked(store, "run_2")
    foreign = await store.claim("run_2", "s", "other", "t", LEASE)
    assert foreign.status == "foreign" and foreign.record is not None and foreign.record.agent_run_id == "a"
    claim = await store.claim("run_2", "s", "a", "t", LEASE)
    assert claim.status == "claimed"
    await store.release("run_2", "t")
    again = await store.claim("run_2", "s", "a", "t4", LEASE)
    assert again.status == "claimed" and not again.taken_over and again.record is not None and again.record.generation == 1


async def test_concurrent_claims_exactly_one_wins(store: RunStore) -> None:
    for i in range(5):
        await _parked(store, f"run_race_{i}")
        claims = await asyncio.gather(*(store.claim(f"run_race_{i}", "s", "a", f"t{j}", LEASE) for j in range(8)))
        assert sorted(c.status for c in claims) == ["busy"] * 7 + ["claimed"]


async def test_cap_is_atomic_under_concurrent_reservations(open_store: Callable[..., RunStore]) -> None:
    """Three scopes race for the whole cap from two handles: exactly ``cap`` slots, none past a scope's share."""
    a, b = await _two_handles(open_store, cap=10)
    scopes = [("s", "a"), ("s", "b"), ("t", "a")]
    try:
        results = await asyncio.gather(*((a if i % 2 else b).reserve_slot(f"run_cap_{i}", *scopes[i % 3], 1.0, f"t{i}", LEASE) for i in range(45)))
        assert sum(r is SlotAnswer.HELD for r in results) == 10
        assert set(results) <= {SlotAnswer.HELD, SlotAnswer.DEPLOYMENT_FULL, SlotAnswer.SCOPE_FULL}
        assert (await a.counts())[0] == 10
        held = [r for r, i in zip(results, range(45), strict=True) if r and i % 3 == 0]
        assert len(held) <= a.scope_share == 8
        assert await a.reserve_slot("run_cap_1", *scopes[1], 1.0, "t1", LEASE) is results[1], "idempotent for a holder"
        assert await a.check_integrity() == []
    finally:
        await a.close()
        await b.close()


async def test_one_scope_holds_at_most_its_share_and_another_scope_still_gets_a_slot(open_store: Callable[..., RunStore]) -> None:
    """SPEC §16.1 item 5: a scope holds at most three quarters of the cap, counted across handles (replicas)."""
    a, b = await _two_handles(open_store, cap=4)
    try:
        assert a.scope_share == 3
        results = await asyncio.gather(*((a if i % 2 else b).reserve_slot(f"run_share_{i}", "s", "greedy", 1.0, f"t{i}", LEASE) for i in range(10)))
        assert sorted(r.value for r in results) == ["held"] * 3 + ["scope_full"] * 7
        assert await b.reserve_slot("run_share_more", "s", "greedy", 1.0, "t", LEASE) is SlotAnswer.SCOPE_FULL
        assert await a.reserve_slot("run_share_other", "s", "other", 1.0, "t", LEASE) is SlotAnswer.HELD, "the last quarter stays for other scopes"
        assert await b.reserve_slot("run_share_third", "u", "greedy", 1.0, "t", LEASE) is SlotAnswer.DEPLOYMENT_FULL, "the whole cap still holds"
        assert (await a.counts())[0] == 4
        first = next(i for i, r in enumerate(results) if r)
        assert await a.remove(f"run_share_{first}", f"t{first}")
        assert await b.reserve_slot("run_share_more", "s", "greedy", 1.0, "t", LEASE) is SlotAnswer.HELD, "a freed slot of the scope is its again"
        assert await a.check_integrity() == []
    finally:
        await a.close()
        await b.close()


async def test_lapsed_lease_is_taken_over_and_the_old_holder_cannot_write(store: RunStore) -> None:
    await _parked(store, "run_3")
    first = await store.claim("run_3", "s", "a", "dead", 0.3)
    assert first.status == "claimed"
    assert (await store.claim("run_3", "s", "a", "other", LEASE)).status == "busy"
    await asyncio.sleep(0.5)
    taken = await store.claim("run_3", "s", "a", "new", LEASE)
    assert taken.status == "claimed" and taken.taken_over, "a lease that lapsed mid-leg is taken over"
    assert await store.renew("run_3", "dead", LEASE) == "lost"
    assert await store.park(_park("run_3", b"stale"), "dead") is None
    assert not await store.remove("run_3", "dead")
    assert await store.renew("run_3", "new", LEASE) == "ok"
    assert await store.park(_park("run_3", b"fresh"), "new") is not None
    again = await store.claim("run_3", "s", "a", "x", LEASE)
    assert again.record is not None and again.record.snapshot == b"fresh" and again.record.generation == 2


async def test_active_record_without_snapshot_whose_leg_died_is_missing(store: RunStore) -> None:
    assert await store.reserve_slot("run_4", "s", "a", 1.0, "dead", 0.2)
    assert (await store.claim("run_4", "s", "a", "t", LEASE)).status == "busy"
    await asyncio.sleep(0.4)
    assert (await store.claim("run_4", "s", "a", "t", LEASE)).status == "missing"
    assert await store.counts() == (0, 0), "its slot is freed"


async def test_expiry_uses_the_store_clock_and_the_sweep_frees_slots_and_snapshots(store: RunStore) -> None:
    await _parked(store, "run_5", ttl=0.3)
    await _parked(store, "run_6", ttl=60)
    assert await store.counts() == (2, 2)
    await asyncio.sleep(0.5)
    swept = await store.sweep()
    assert [r.run_id for r in swept] == ["run_5"]
    assert await store.counts() == (1, 1)
    assert await store.get("run_5") is None
    await _parked(store, "run_7", ttl=0.2)
    await asyncio.sleep(0.4)
    assert (await store.claim("run_7", "s", "a", "t", LEASE)).status == "missing", "a claim never resumes an expired run"


async def test_sweep_and_count_counts_what_the_sweep_left(store: RunStore) -> None:
    await _parked(store, "run_9", ttl=0.2)
    await _parked(store, "run_10", ttl=60)
    await asyncio.sleep(0.4)
    swept, counts = await store.sweep_and_count()
    assert [r.run_id for r in swept] == ["run_9"] and counts == (1, 1) == await store.counts()


async def test_a_claimed_run_is_not_swept_while_its_lease_lives(store: RunStore) -> None:
    await _parked(store, "run_8", ttl=0.2)
    assert (await store.claim("run_8", "s", "a", "t", LEASE)).status == "claimed"
    await asyncio.sleep(0.4)
    assert await store.sweep() == []
    assert await store.renew("run_8", "t", LEASE) == "ok"


async def test_cancel_leaves_a_tombstone_until_the_original_expiry(store: RunStore) -> None:
    await _parked(store, "run_9", ttl=0.5)
    claim = await store.claim("run_9", "s", "a", "leg", LEASE)
    assert claim.status == "claimed"
    await store.cancel("run_9", "s", "a", until=(await store.now()) + 100)
    assert await store.renew("run_9", "leg", LEASE) == "cancelled", "the leg learns of the cancel"
    assert await store.counts() == (0, 0), "slot and snapshot freed at once"
    assert (await store.claim("run_9", "s", "a", "t", LEASE)).status == "cancelled"
    assert (await store.claim("run_9", "s", "b", "t", LEASE)).status == "missing"
    assert not await store.reserve_slot("run_9", "s", "a", 1.0, "t", LEASE)
    assert not await store.remove("run_9", None) and not await store.remove("run_9", "leg")
    assert await store.list_scope("s", "a") == []
    await asyncio.sleep(0.7)
    assert (await store.claim("run_9", "s", "a", "t", LEASE)).status == "missing"
    await store.cancel("run_never_stored", "s", "a", until=(await store.now()) + 100)
    assert (await store.claim("run_never_stored", "s", "a", "t", LEASE)).status == "cancelled"


async def test_remove_without_a_lease_spares_a_run_a_leg_holds(store: RunStore) -> None:
    await _parked(store, "run_10")
    await _parked(store, "run_11")
    assert (await store.claim("run_10", "s", "a", "t", LEASE)).status == "claimed"
    assert not await store.remove("run_10", None)
    assert await store.remove("run_11", None)
    assert [r.run_id for r in await store.list_scope("s", "a")] == ["run_10"]


async def test_list_scope_is_oldest_first_and_shows_every_handle(open_store: Callable[..., RunStore]) -> None:
    a, b = await _two_handles(open_store)
    try:
        for i, s in enumerate((a, b, a)):
            assert await s.reserve_slot(f"run_l{i}", "s", "a", 10.0 + i, "t", LEASE)
        assert await b.reserve_slot("run_other", "s", "z", 1.0, "t", LEASE)
        assert [r.run_id for r in await b.list_scope("s", "a")] == ["run_l0", "run_l1", "run_l2"]
    finally:
        await a.close()
        await b.close()


async def test_records_survive_reopening(open_store: Callable[..., RunStore]) -> None:
    s = open_store()
    if s.kind == "memory":
        pytest.skip("memory: keeps nothing by design")
    await s.open()
    await _parked(s, "run_keep", data=b"x" * 5000)
    await s.close()
    again = open_store()
    await again.open()  # migrations are idempotent
    try:
        claim = await again.claim("run_keep", "s", "a", "t", LEASE)
        assert claim.status == "claimed" and claim.record is not None and claim.record.snapshot == b"x" * 5000
        assert await again.check_integrity() == []
    finally:
        await again.close()


async def test_integrity_check_catches_a_snapshot_that_does_not_match(store: RunStore) -> None:
    if store.kind != "sqlite":
        pytest.skip("tampering needs direct file access")
    await _parked(store, "run_bad", data=b"good")
    from cellblock.server.store import SqliteRunStore

    assert isinstance(store, SqliteRunStore)
    await store.call(lambda c: c.execute("UPDATE cellblock_snapshots SET snapshot = ? WHERE run_id = 'run_bad'", (b"evil",)))
    assert await store.check_integrity() == ["run_bad: suspended without a matching snapshot"]
    await store.call(lambda c: c.execute("DELETE FROM cellblock_runs"))
    assert await store.check_integrity() == ["run_bad: a snapshot without its run"]
    await store.call(lambda c: c.execute("DELETE FROM cellblock_snapshots"))


@pytest.mark.parametrize(
    "url",
    ["redis://x", "sqlite://relative.db", "sqlite:///", "", "memory"],
)
async def test_unknown_or_malformed_store_urls_fail_closed(url: str) -> None:
    with pytest.raises(StoreUnavailableError):
        make_run_store(url, 8)


async def test_unreachable_postgresql_fails_closed(tmp_path: object) -> None:
    store = make_run_store(f"postgresql://postgres@/postgres?host={tmp_path}", 8)
    with pytest.raises(StoreUnavailableError, match="cannot open the PostgreSQL run store"):
        await store.open()


async def test_unwritable_sqlite_path_fails_closed(tmp_path: object) -> None:
    blocker = f"{tmp_path}/file"
    open(blocker, "w").close()
    store = make_run_store(f"sqlite://{blocker}/runs.sqlite3", 8)
    with pytest.raises(StoreUnavailableError):
        await store.open()


async def test_a_schema_newer_than_the_code_is_refused(open_store: Callable[..., RunStore]) -> None:
    s = open_store()
    if s.kind == "memory":
        pytest.skip("no schema")
    await s.open()
    from cellblock.server.store._sql import SqlRunStore

    assert isinstance(s, SqlRunStore)
    async with s.transaction() as tx:
        await tx.run("INSERT INTO cellblock_schema_migrations (version, name, applied_at) VALUES (?, ?, ?)", 9999, "future", 0.0)
    await s.close()
    with pytest.raises(StoreUnavailableError, match="newer than this cellblock"):
        await open_store().open()


async def test_an_operation_cancelled_as_its_transaction_begins_leaves_the_store_usable(store: RunStore) -> None:
    # A leg's stream cancelled by its client may cancel a store call at any await, also while the
    # transaction's BEGIN is still running on the store's thread: it must not stay open.
    # Cancelled at every point of the first awaits, on the loop and on the store's thread.
    for delay in (0, 0, 0.0002, 0.0005, 0.001, 0.002, 0.003, 0.005):
        for ticks in range(3):
            task = asyncio.create_task(store.sweep())
            for _ in range(ticks):
                await asyncio.sleep(0)
            if delay:
                time.sleep(delay)
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
    await _parked(store, "run_after_cancel")
    assert (await store.counts())[0] == 1
