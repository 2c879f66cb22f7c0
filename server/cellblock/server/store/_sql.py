"""The run store's rules, written once in SQL for SQLite and PostgreSQL (SPEC §16.1).

:class:`SqlRunStore` implements every :class:`RunStore` method as one
transaction over a small statement interface (:class:`Tx`); the backends
supply the connection, the transaction, the clock, row locking and the
cap lock. Statements use ``?`` placeholders; PostgreSQL's are rewritten to
``$n``.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import replace
from pathlib import Path
from typing import Any

from cellblock.server.store._base import (
    Claim,
    Park,
    RecordState,
    RenewStatus,
    RunRecord,
    RunStore,
    SlotAnswer,
    StoreUnavailableError,
    refused_claim,
    snapshot_digest,
)

TABLE = "cellblock_runs"
#: The snapshots of the runs whose record names one (migration 0002): a claim, a release and a
#: renewal rewrite the run's row without them.
SNAPSHOTS = "cellblock_snapshots"
_HEADER = (
    "run_id, session_id, agent_run_id, state, created_at, expires_at, holds_slot, generation, body, "
    "snapshot_size, snapshot_sha256, engine_build_id, lease_token, lease_until"
)
#: Not held by a live lease at store time ``?``.
_FREE = "(lease_token IS NULL OR lease_until <= ?)"
#: Records the sweep deletes at store time ``?`` (three times).
_EXPIRED = (
    f"((state = 'suspended' AND expires_at <= ? AND {_FREE}) "
    f"OR (state = 'active' AND {_FREE} AND (snapshot_size = 0 OR expires_at <= ?)) "
    "OR (state = 'cancelled' AND expires_at <= ?))"
)
MIGRATIONS = Path(__file__).with_name("migrations")


class Tx(abc.ABC):
    """The statements of one open transaction."""

    @abc.abstractmethod
    async def one(self, sql: str, *args: Any) -> Sequence[Any] | None:
        """The first row of a query, or ``None``."""

    @abc.abstractmethod
    async def all(self, sql: str, *args: Any) -> list[Sequence[Any]]:
        """Every row of a query."""

    @abc.abstractmethod
    async def run(self, sql: str, *args: Any) -> int:
        """Runs a statement; returns the rows it changed."""


def _record(row: Sequence[Any], snapshot: bytes | None = None) -> RunRecord:
    state: RecordState = row[3]
    return RunRecord(
        run_id=row[0],
        session_id=row[1],
        agent_run_id=row[2],
        state=state,
        created_at=float(row[4]),
        expires_at=float(row[5]),
        holds_slot=bool(row[6]),
        generation=int(row[7]),
        body=bytes(row[8] or b""),
        snapshot=snapshot,
        snapshot_size=int(row[9]),
        snapshot_sha256=row[10],
        engine_build_id=row[11],
        lease_token=row[12],
        lease_until=float(row[13]),
    )


def migration_files(dialect: str) -> list[tuple[int, str, str]]:
    """The repository's migrations of a dialect: ``(version, name, sql)``, in order.

    Files are ``migrations/<dialect>/<NNNN>_<name>.sql``; each is applied once, in
    version order, in its own transaction.
    """
    found = []
    for path in sorted((MIGRATIONS / dialect).glob("*.sql")):
        version = int(path.name.split("_", 1)[0])
        found.append((version, path.stem, path.read_text(encoding="utf-8")))
    return found


#: The run row's columns, in the order every insert gives their values (a slot, a first park, a tombstone).
_INSERT_RUN = (
    f"INSERT INTO {TABLE} (run_id, session_id, agent_run_id, state, created_at, expires_at, holds_slot, generation, body, "
    "snapshot_size, snapshot_sha256, snapshot_placement, engine_build_id, lease_token, lease_until, updated_at) "
)


class SqlRunStore(RunStore):
    """The shared implementation; subclasses provide the connection."""

    #: Appended to a row read that the transaction then updates (``FOR UPDATE`` on PostgreSQL).
    for_update = ""

    @abc.abstractmethod
    def transaction(self) -> AbstractAsyncContextManager[Tx]:
        """Opens one serialisable-enough transaction (committed on exit, rolled back on error)."""

    @abc.abstractmethod
    async def tx_now(self, tx: Tx) -> float:
        """The store clock inside a transaction."""

    @abc.abstractmethod
    async def lock_slots(self, tx: Tx) -> None:
        """Serialises slot accounting across the deployment for the rest of ``tx``."""

    async def backend_check(self, tx: Tx) -> list[str]:
        """Backend-specific integrity problems (none by default)."""
        return []

    async def now(self) -> float:
        async with self.transaction() as tx:
            return await self.tx_now(tx)

    async def migrate(self, dialect: str, tx_factory: Any) -> None:
        """Applies missing migrations; refuses a schema newer than this code.

        Args:
            dialect: ``sqlite`` or ``postgresql``.
            tx_factory: Opens a migration transaction in which concurrent starters wait.

        Raises:
            StoreUnavailableError: The store's schema is newer than the repository's.
        """
        files = migration_files(dialect)
        known = max((v for v, _n, _s in files), default=0)
        for version, name, sql in files:
            async with tx_factory() as tx:
                await tx.run("CREATE TABLE IF NOT EXISTS cellblock_schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at DOUBLE PRECISION NOT NULL)")
                row = await tx.one("SELECT max(version) FROM cellblock_schema_migrations")
                current = int(row[0]) if row and row[0] is not None else 0
                if current > known:
                    raise StoreUnavailableError(f"the run store's schema is version {current}, newer than this cellblock's ({known}); upgrade cellblock")
                if version <= current:
                    continue
                for statement in (s.strip() for s in sql.split(";")):
                    if statement:
                        await tx.run(statement)
                await tx.run("INSERT INTO cellblock_schema_migrations (version, name, applied_at) VALUES (?, ?, ?)", version, name, await self.tx_now(tx))

    # ------------------------------------------------------------------ slots and parking
    async def reserve_slot(self, run_id: str, session_id: str, agent_run_id: str, created_at: float, lease_token: str, lease_seconds: float) -> SlotAnswer:
        async with self.transaction() as tx:
            now = await self.tx_now(tx)
            await self.lock_slots(tx)
            row = await tx.one(f"SELECT holds_slot, state FROM {TABLE} WHERE run_id = ?{self.for_update}", run_id)
            if row is not None and row[1] != "cancelled" and row[0]:
                return SlotAnswer.HELD
            if row is not None:
                return SlotAnswer.CANCELLED  # a tombstone: the run was cancelled
            refused = await self._refusal(tx, session_id, agent_run_id)
            if refused is not None:
                return refused
            await tx.run(
                _INSERT_RUN + "VALUES (?, ?, ?, 'active', ?, 0, 1, 0, ?, 0, '', 'inline', '', ?, ?, ?)",
                run_id, session_id, agent_run_id, created_at, b"", lease_token, now + lease_seconds, now,
            )
            return SlotAnswer.HELD

    async def _refusal(self, tx: Tx, session_id: str, agent_run_id: str) -> SlotAnswer | None:
        """Why the scope cannot take one more slot now, else ``None``; the caller holds the cap lock."""
        # Both counts under the cap lock, in the insert's transaction (SPEC §16.1 item 5).
        # Each count on its own index (cellblock_runs_slots, cellblock_runs_scope), in one round trip; the unary
        # plus keeps SQLite's planner (no statistics) off the slots index for the scope's count.
        scope_held = f"SELECT count(*) FROM {TABLE} WHERE session_id = ? AND agent_run_id = ? AND +holds_slot = 1"
        held = await tx.one(f"SELECT (SELECT count(*) FROM {TABLE} WHERE holds_slot = 1), ({scope_held})", session_id, agent_run_id)
        total, scope = (int(held[0]), int(held[1])) if held is not None else (0, 0)
        if scope >= self.scope_share:
            return SlotAnswer.SCOPE_FULL
        if total >= self.cap:
            return SlotAnswer.DEPLOYMENT_FULL
        return None

    async def park_with_slot(self, park: Park) -> float | SlotAnswer | None:
        async with self.transaction() as tx:
            now = await self.tx_now(tx)
            await self.lock_slots(tx)
            row = await tx.one(f"SELECT state FROM {TABLE} WHERE run_id = ?{self.for_update}", park.run_id)
            if row is not None:
                return SlotAnswer.CANCELLED if row[0] == "cancelled" else None
            refused = await self._refusal(tx, park.session_id, park.agent_run_id)
            if refused is not None:
                return refused
            expires = now + park.ttl_seconds
            await tx.run(
                _INSERT_RUN + "VALUES (?, ?, ?, 'suspended', ?, ?, 1, 1, ?, ?, ?, 'inline', ?, NULL, 0, ?)",
                park.run_id, park.session_id, park.agent_run_id, park.created_at, expires, park.body, len(park.snapshot), snapshot_digest(park.snapshot), park.engine_build_id, now,
            )
            await self._put_snapshot(tx, park)
            return expires

    async def _put_snapshot(self, tx: Tx, park: Park) -> None:
        await tx.run(
            f"INSERT INTO {SNAPSHOTS} (run_id, snapshot) VALUES (?, ?) ON CONFLICT (run_id) DO UPDATE SET snapshot = excluded.snapshot", park.run_id, park.snapshot
        )

    async def park(self, park: Park, lease_token: str) -> float | None:
        async with self.transaction() as tx:
            now = await self.tx_now(tx)
            row = await tx.one(f"SELECT state, lease_token FROM {TABLE} WHERE run_id = ?{self.for_update}", park.run_id)
            if row is None or row[0] != "active" or row[1] != lease_token:
                return None
            expires = now + park.ttl_seconds
            await tx.run(
                f"UPDATE {TABLE} SET state = 'suspended', expires_at = ?, generation = generation + 1, body = ?, snapshot_size = ?, "
                "snapshot_sha256 = ?, snapshot_placement = 'inline', engine_build_id = ?, lease_token = NULL, lease_until = 0, updated_at = ? WHERE run_id = ?",
                expires, park.body, len(park.snapshot), snapshot_digest(park.snapshot), park.engine_build_id, now, park.run_id,
            )
            await self._put_snapshot(tx, park)
            return expires

    # ------------------------------------------------------------------ claims and leases
    async def claim(self, run_id: str, session_id: str, agent_run_id: str, lease_token: str, lease_seconds: float) -> Claim:
        async with self.transaction() as tx:
            now = await self.tx_now(tx)
            row = await tx.one(f"SELECT {_HEADER} FROM {TABLE} WHERE run_id = ?{self.for_update}", run_id)
            if row is None:
                return Claim("missing")
            record = _record(row)
            expired = await tx.one(f"SELECT 1 FROM {TABLE} WHERE run_id = ? AND {_EXPIRED}", run_id, now, now, now, now, now)
            if expired is not None:
                await tx.run(f"DELETE FROM {TABLE} WHERE run_id = ?", run_id)
                await self._drop_snapshots(tx, [run_id])
                return Claim("missing")
            refused = refused_claim(record, session_id, agent_run_id, now)
            if refused is not None:
                return refused
            stored = await tx.one(f"SELECT snapshot FROM {SNAPSHOTS} WHERE run_id = ?", run_id)
            record = replace(record, snapshot=bytes(stored[0]) if stored is not None else None)
            until = now + lease_seconds
            await tx.run(f"UPDATE {TABLE} SET state = 'active', lease_token = ?, lease_until = ?, updated_at = ? WHERE run_id = ?", lease_token, until, now, run_id)
            taken_over = record.state == "active"
            return Claim("claimed", replace(record, state="active", lease_token=lease_token, lease_until=until), taken_over)

    async def renew(self, run_id: str, lease_token: str, lease_seconds: float) -> RenewStatus:
        async with self.transaction() as tx:
            now = await self.tx_now(tx)
            row = await tx.one(f"SELECT state, lease_token FROM {TABLE} WHERE run_id = ?{self.for_update}", run_id)
            if row is not None and row[0] == "cancelled":
                return "cancelled"
            if row is None or row[1] != lease_token:
                return "lost"
            await tx.run(f"UPDATE {TABLE} SET lease_until = ? WHERE run_id = ?", now + lease_seconds, run_id)
            return "ok"

    async def release(self, run_id: str, lease_token: str, body: bytes | None = None) -> None:
        async with self.transaction() as tx:
            now = await self.tx_now(tx)
            where = "WHERE run_id = ? AND lease_token = ? AND state = 'active' AND snapshot_size > 0"
            if body is None:
                await tx.run(f"UPDATE {TABLE} SET state = 'suspended', lease_token = NULL, lease_until = 0, updated_at = ? {where}", now, run_id, lease_token)
            else:
                await tx.run(f"UPDATE {TABLE} SET state = 'suspended', lease_token = NULL, lease_until = 0, updated_at = ?, body = ? {where}", now, body, run_id, lease_token)

    # ------------------------------------------------------------------ ends
    async def remove(self, run_id: str, lease_token: str | None) -> bool:
        async with self.transaction() as tx:
            if lease_token is not None:
                removed = await tx.run(f"DELETE FROM {TABLE} WHERE run_id = ? AND lease_token = ? AND state <> 'cancelled'", run_id, lease_token) > 0
            else:
                now = await self.tx_now(tx)
                removed = await tx.run(f"DELETE FROM {TABLE} WHERE run_id = ? AND state <> 'cancelled' AND {_FREE}", run_id, now) > 0
            if removed:
                await self._drop_snapshots(tx, [run_id])
            return removed

    @staticmethod
    async def _drop_snapshots(tx: Tx, run_ids: Sequence[str]) -> None:
        """Deletes the snapshots of ``run_ids`` (records deleted or cancelled in ``tx``), 500 ids a statement.

        A sweep may free more runs at once than a statement may bind parameters (SQLite: 32766).
        """
        for i in range(0, len(run_ids), 500):
            ids = run_ids[i : i + 500]
            await tx.run(f"DELETE FROM {SNAPSHOTS} WHERE run_id IN ({', '.join('?' * len(ids))})", *ids)

    async def cancel(self, run_id: str, session_id: str, agent_run_id: str, until: float) -> None:
        async with self.transaction() as tx:
            now = await self.tx_now(tx)
            row = await tx.one(f"SELECT expires_at FROM {TABLE} WHERE run_id = ?{self.for_update}", run_id)
            if row is None:
                await tx.run(
                    _INSERT_RUN + "VALUES (?, ?, ?, 'cancelled', ?, ?, 0, 0, ?, 0, '', 'inline', '', NULL, 0, ?)",
                    run_id, session_id, agent_run_id, now, until, b"", now,
                )
                return
            keep = float(row[0]) if float(row[0]) > 0 else until
            await tx.run(
                f"UPDATE {TABLE} SET state = 'cancelled', expires_at = ?, holds_slot = 0, body = ?, snapshot_size = 0, "
                "snapshot_sha256 = '', lease_token = NULL, lease_until = 0, updated_at = ? WHERE run_id = ?",
                keep, b"", now, run_id,
            )
            await self._drop_snapshots(tx, [run_id])

    async def sweep(self) -> list[RunRecord]:
        async with self.transaction() as tx:
            now = await self.tx_now(tx)
            rows = await tx.all(f"DELETE FROM {TABLE} WHERE {_EXPIRED} RETURNING {_HEADER}", now, now, now, now, now)
            swept = [_record(r) for r in rows]
            await self._drop_snapshots(tx, [r.run_id for r in swept])
            return [r for r in swept if r.state != "cancelled"]

    # ------------------------------------------------------------------ reads
    async def get(self, run_id: str) -> RunRecord | None:
        async with self.transaction() as tx:
            row = await tx.one(f"SELECT {_HEADER} FROM {TABLE} WHERE run_id = ?", run_id)
            return None if row is None else _record(row)

    async def list_scope(self, session_id: str, agent_run_id: str) -> list[RunRecord]:
        async with self.transaction() as tx:
            rows = await tx.all(
                f"SELECT {_HEADER} FROM {TABLE} WHERE session_id = ? AND agent_run_id = ? AND state <> 'cancelled' ORDER BY created_at, run_id",
                session_id, agent_run_id,
            )
            return [_record(r) for r in rows]

    async def counts(self) -> tuple[int, int]:
        async with self.transaction() as tx:
            row = await tx.one(f"SELECT COALESCE(SUM(holds_slot), 0), COALESCE(SUM(CASE WHEN state = 'suspended' THEN 1 ELSE 0 END), 0) FROM {TABLE}")
            return (int(row[0]), int(row[1])) if row is not None else (0, 0)

    async def check_integrity(self) -> list[str]:
        problems: list[str] = []
        async with self.transaction() as tx:
            problems += await self.backend_check(tx)
            rows = await tx.all(
                f"SELECT r.run_id, r.state, r.holds_slot, r.body, s.snapshot, r.snapshot_size, r.snapshot_sha256, r.snapshot_placement "
                f"FROM {TABLE} r LEFT JOIN {SNAPSHOTS} s ON s.run_id = r.run_id"
            )
            orphans = await tx.all(f"SELECT run_id FROM {SNAPSHOTS} WHERE run_id NOT IN (SELECT run_id FROM {TABLE})")
        problems += [f"{orphan[0]}: a snapshot without its run" for orphan in orphans]
        slots = 0
        for run_id, state, holds, body, snapshot, size, digest, placement in rows:
            slots += int(holds)
            data = bytes(snapshot) if snapshot is not None else None
            if placement != "inline":
                problems.append(f"{run_id}: unknown snapshot placement {placement!r}")
            if state == "suspended":
                if data is None or len(data) != size or snapshot_digest(data) != digest:
                    problems.append(f"{run_id}: suspended without a matching snapshot")
                if not body:
                    problems.append(f"{run_id}: suspended without a body")
                if not holds:
                    problems.append(f"{run_id}: suspended without a slot")
            elif state == "cancelled":
                if holds or data is not None:
                    problems.append(f"{run_id}: a tombstone holds a slot or a snapshot")
            elif state == "active":
                if data is not None and (len(data) != size or snapshot_digest(data) != digest):
                    problems.append(f"{run_id}: active with a snapshot that does not match its digest")
            else:
                problems.append(f"{run_id}: unknown state {state!r}")
        if slots > self.cap:
            problems.append(f"{slots} slots held, more than the cap ({self.cap})")
        return problems
