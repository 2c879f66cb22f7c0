"""A first suspension takes its slot in its park's one transaction (``RunStore.park_with_slot``, SPEC §10.4 "Parking").

On every backend: the record and its snapshot appear together, suspended and holding a
slot, counted against the cap and the scope's share exactly as a reservation is; a
refusal writes nothing; a tombstone refuses it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from cellblock.server.store import Park, RunStore, SlotAnswer

pytestmark = pytest.mark.asyncio(loop_scope="session")
LEASE = 5.0


def _park(run_id: str, scope: tuple[str, str] = ("s", "a"), data: bytes = b"snap" * 1000) -> Park:
    return Park(run_id, scope[0], scope[1], 1.0, b'{"v":1}', data, "build-1", 60.0)


async def test_a_park_with_its_slot_is_one_suspended_record_that_a_wait_claims(store: RunStore) -> None:
    before = await store.now()
    expires = await store.park_with_slot(_park("run_first"))
    assert isinstance(expires, float) and before + 59 < expires < before + 62
    got = await store.get("run_first")
    assert got is not None and (got.state, got.holds_slot, got.generation, got.lease_token) == ("suspended", True, 1, None)
    assert got.snapshot_size == 4000 and got.expires_at == expires
    assert await store.counts() == (1, 1)
    claim = await store.claim("run_first", "s", "a", "t", LEASE)
    assert claim.status == "claimed" and claim.record is not None and claim.record.snapshot == b"snap" * 1000
    assert await store.check_integrity() == []
    assert await store.remove("run_first", "t")
    assert await store.counts() == (0, 0)


async def test_the_cap_and_the_scope_share_refuse_it_and_nothing_is_written(open_store: Callable[..., RunStore]) -> None:
    store = open_store(cap=4)
    await store.open()
    try:
        assert store.scope_share == 3
        answers = await asyncio.gather(*(store.park_with_slot(_park(f"run_g{i}", ("s", "greedy"))) for i in range(5)))
        assert sum(isinstance(a, float) for a in answers) == 3 and answers.count(SlotAnswer.SCOPE_FULL) == 2
        assert await store.reserve_slot("run_other", "s", "other", 1.0, "t", LEASE) is SlotAnswer.HELD, "the last quarter stays for other scopes"
        assert await store.park_with_slot(_park("run_third", ("u", "x"))) is SlotAnswer.DEPLOYMENT_FULL
        assert await store.get("run_third") is None and await store.counts() == (4, 3)
        assert await store.check_integrity() == []
    finally:
        await store.close()


async def test_a_tombstone_or_another_record_of_the_run_refuses_it(store: RunStore) -> None:
    await store.cancel("run_gone", "s", "a", (await store.now()) + 60)
    assert await store.park_with_slot(_park("run_gone")) is SlotAnswer.CANCELLED
    assert await store.reserve_slot("run_held", "s", "a", 1.0, "t", LEASE) is SlotAnswer.HELD
    assert await store.park_with_slot(_park("run_held")) is None, "a run with a record parks under its lease"
    got = await store.get("run_held")
    assert got is not None and got.state == "active" and got.snapshot_size == 0
    assert await store.counts() == (1, 0)
