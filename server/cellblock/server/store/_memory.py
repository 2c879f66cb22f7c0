"""The in-memory run store, only when named (``CELLBLOCK_STORE=memory:``; tests, development).

Same rules as the SQL stores (the shared contract tests in ``tests/unit/store``
run against all three); nothing survives the process.
"""

from __future__ import annotations

import time
from dataclasses import replace

from cellblock.server.store._base import Claim, Park, RenewStatus, RunRecord, RunStore, SlotAnswer, refused_claim, snapshot_digest


class MemoryRunStore(RunStore):
    """Records in a dict of this process. Used from one event loop (no awaits inside a method)."""

    kind = "memory"

    def __init__(self, cap: int) -> None:
        super().__init__(cap)
        self._rows: dict[str, RunRecord] = {}

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def now(self) -> float:
        return time.time()

    def _expired(self, r: RunRecord, now: float) -> bool:
        free = not r.leased(now)
        if r.state == "suspended":
            return r.expires_at <= now and free
        if r.state == "active":
            return free and (r.snapshot_size == 0 or r.expires_at <= now)
        return r.expires_at <= now

    async def reserve_slot(self, run_id: str, session_id: str, agent_run_id: str, created_at: float, lease_token: str, lease_seconds: float) -> SlotAnswer:
        now = time.time()
        row = self._rows.get(run_id)
        if row is not None:
            return SlotAnswer.HELD if row.state != "cancelled" and row.holds_slot else SlotAnswer.CANCELLED
        refused = self._refusal(session_id, agent_run_id)
        if refused is not None:
            return refused
        self._rows[run_id] = RunRecord(run_id, session_id, agent_run_id, "active", created_at, holds_slot=True, lease_token=lease_token, lease_until=now + lease_seconds)
        return SlotAnswer.HELD

    def _refusal(self, session_id: str, agent_run_id: str) -> SlotAnswer | None:
        held = [r for r in self._rows.values() if r.holds_slot]
        if sum(1 for r in held if (r.session_id, r.agent_run_id) == (session_id, agent_run_id)) >= self.scope_share:
            return SlotAnswer.SCOPE_FULL
        if len(held) >= self.cap:
            return SlotAnswer.DEPLOYMENT_FULL
        return None

    async def park_with_slot(self, park: Park) -> float | SlotAnswer | None:
        row = self._rows.get(park.run_id)
        if row is not None:
            return SlotAnswer.CANCELLED if row.state == "cancelled" else None
        refused = self._refusal(park.session_id, park.agent_run_id)
        if refused is not None:
            return refused
        expires = time.time() + park.ttl_seconds
        self._rows[park.run_id] = RunRecord(
            park.run_id, park.session_id, park.agent_run_id, "suspended", park.created_at, expires_at=expires, holds_slot=True, generation=1, body=park.body,
            snapshot=park.snapshot, snapshot_size=len(park.snapshot), snapshot_sha256=snapshot_digest(park.snapshot), engine_build_id=park.engine_build_id,
        )
        return expires

    async def park(self, park: Park, lease_token: str) -> float | None:
        row = self._rows.get(park.run_id)
        if row is None or row.state != "active" or row.lease_token != lease_token:
            return None
        expires = time.time() + park.ttl_seconds
        self._rows[park.run_id] = replace(
            row,
            state="suspended",
            expires_at=expires,
            generation=row.generation + 1,
            body=park.body,
            snapshot=park.snapshot,
            snapshot_size=len(park.snapshot),
            snapshot_sha256=snapshot_digest(park.snapshot),
            engine_build_id=park.engine_build_id,
            lease_token=None,
            lease_until=0.0,
        )
        return expires

    async def claim(self, run_id: str, session_id: str, agent_run_id: str, lease_token: str, lease_seconds: float) -> Claim:
        now = time.time()
        row = self._rows.get(run_id)
        if row is None:
            return Claim("missing")
        if self._expired(row, now):
            del self._rows[run_id]
            return Claim("missing")
        refused = refused_claim(row, session_id, agent_run_id, now)
        if refused is not None:
            return refused
        claimed = replace(row, state="active", lease_token=lease_token, lease_until=now + lease_seconds)
        self._rows[run_id] = claimed
        return Claim("claimed", claimed, taken_over=row.state == "active")

    async def renew(self, run_id: str, lease_token: str, lease_seconds: float) -> RenewStatus:
        row = self._rows.get(run_id)
        if row is not None and row.state == "cancelled":
            return "cancelled"
        if row is None or row.lease_token != lease_token:
            return "lost"
        self._rows[run_id] = replace(row, lease_until=time.time() + lease_seconds)
        return "ok"

    async def release(self, run_id: str, lease_token: str, body: bytes | None = None) -> None:
        row = self._rows.get(run_id)
        if row is not None and row.lease_token == lease_token and row.state == "active" and row.snapshot_size > 0:
            self._rows[run_id] = replace(row, state="suspended", lease_token=None, lease_until=0.0, body=row.body if body is None else body)

    async def remove(self, run_id: str, lease_token: str | None) -> bool:
        row = self._rows.get(run_id)
        if row is None or row.state == "cancelled":
            return False
        if (lease_token is not None and row.lease_token != lease_token) or (lease_token is None and row.leased(time.time())):
            return False
        del self._rows[run_id]
        return True

    async def cancel(self, run_id: str, session_id: str, agent_run_id: str, until: float) -> None:
        row = self._rows.get(run_id)
        keep = row.expires_at if row is not None and row.expires_at > 0 else until
        base = row or RunRecord(run_id, session_id, agent_run_id, "cancelled", time.time())
        self._rows[run_id] = replace(
            base, state="cancelled", expires_at=keep, holds_slot=False, body=b"", snapshot=None, snapshot_size=0, snapshot_sha256="", lease_token=None, lease_until=0.0
        )

    async def sweep(self) -> list[RunRecord]:
        now = time.time()
        gone = [r for r in self._rows.values() if self._expired(r, now)]
        for r in gone:
            del self._rows[r.run_id]
        return [r.without_snapshot() for r in gone if r.state != "cancelled"]

    async def get(self, run_id: str) -> RunRecord | None:
        row = self._rows.get(run_id)
        return None if row is None else row.without_snapshot()

    async def list_scope(self, session_id: str, agent_run_id: str) -> list[RunRecord]:
        rows = [r.without_snapshot() for r in self._rows.values() if (r.session_id, r.agent_run_id) == (session_id, agent_run_id) and r.state != "cancelled"]
        return sorted(rows, key=lambda r: (r.created_at, r.run_id))

    async def counts(self) -> tuple[int, int]:
        rows = list(self._rows.values())
        return sum(1 for r in rows if r.holds_slot), sum(1 for r in rows if r.state == "suspended")

    async def check_integrity(self) -> list[str]:
        problems = []
        for r in self._rows.values():
            if r.state == "suspended" and (r.snapshot is None or snapshot_digest(r.snapshot) != r.snapshot_sha256 or not r.body or not r.holds_slot):
                problems.append(f"{r.run_id}: suspended without a matching snapshot, body or slot")
            if r.state == "cancelled" and (r.holds_slot or r.snapshot is not None):
                problems.append(f"{r.run_id}: a tombstone holds a slot or a snapshot")
        slots = sum(1 for r in self._rows.values() if r.holds_slot)
        if slots > self.cap:
            problems.append(f"{slots} slots held, more than the cap ({self.cap})")
        return problems
