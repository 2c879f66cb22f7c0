"""The run store seam: records, leases, claims and the interface (SPEC §10.7, §16.1).

A *run record* is one row per run that needs the store: a run holding a
suspended-run slot (it dispatched a nested call or parked), a suspended run
with its snapshot, or a cancelled run's tombstone. The record's ``body`` is
the run's state as an opaque document that :mod:`cellblock.server.runs`
encodes; the store reads only the columns it needs to enforce the rules:
scope, state, times, the slot flag, the lease and the snapshot.

Every time a rule depends on (expiry, lease lapse) comes from the store's own
clock (:meth:`RunStore.now`), so any replica can sweep and take over.
"""

from __future__ import annotations

import abc
import enum
import hashlib
from dataclasses import dataclass, replace
from typing import Literal, TypeAlias

from cellblock.server.limits import scope_share

#: A record's state. ``active``: a leg holds (or held) it; ``suspended``: parked with a
#: snapshot, no leg; ``cancelled``: a tombstone until the run's original expiry (SPEC §3.6).
RecordState: TypeAlias = Literal["active", "suspended", "cancelled"]

#: How a claim ended (:meth:`RunStore.claim`).
ClaimStatus: TypeAlias = Literal["claimed", "busy", "foreign", "cancelled", "missing"]

#: What a lease renewal found (:meth:`RunStore.renew`).
RenewStatus: TypeAlias = Literal["ok", "lost", "cancelled"]

#: Where a record's snapshot bytes live. Only ``inline`` (in the record's own row, written
#: in the same transaction) exists; an object-storage placement would add a value here and
#: keep the row's ``snapshot_sha256`` as the binding between record and object.
SnapshotPlacement: TypeAlias = Literal["inline"]

#: Default lease length in seconds (SPEC §16.1 item 4); renewed every third of it.
DEFAULT_LEASE_SECONDS = 15.0


class StoreUnavailableError(RuntimeError):
    """The run store cannot be opened or used (bad URL, unreachable server, bad schema).

    The service refuses to start on it (fail closed, SPEC §16.1 item 1).
    """


class StoreTimeoutError(RuntimeError):
    """A run-store call did not answer within the store wait (SPEC §16.1 item 9, [R25]).

    Args:
        call: The store call's name (``park``, ``claim``, …).
        limit_s: The store wait in seconds.
    """

    def __init__(self, call: str, limit_s: float) -> None:
        super().__init__(f"the run store did not answer {call or 'a call'} within {limit_s:g} s")
        self.call = call
        self.limit_s = limit_s


def snapshot_digest(data: bytes) -> str:
    """SHA-256 hex digest of snapshot bytes, kept with the record for integrity checks."""
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class RunRecord:
    """One run as the store keeps it.

    Attributes:
        run_id: ``run_`` plus 32 hex digits.
        session_id, agent_run_id: The run's scope.
        state: See :data:`RecordState`.
        created_at: When the exec started (epoch seconds).
        expires_at: Store-clock expiry set at the last park (epoch seconds); 0 before a park.
        holds_slot: Whether the run counts against the suspended-run cap.
        generation: Parks so far; a park writes ``generation + 1``.
        body: The run's state document (encoded by the runs package), ``b""`` for tombstones.
        snapshot: The snapshot bytes, when loaded (claims load them; listings do not).
        snapshot_size: Length of the stored snapshot in bytes (0 without one).
        snapshot_sha256: Hex digest of the stored snapshot (``""`` without one).
        engine_build_id: The engine build that made the snapshot (SPEC §16.1 item 8).
        lease_token: The lease holder's token, or ``None``.
        lease_until: Store-clock end of the lease (epoch seconds), 0 without one.
    """

    run_id: str
    session_id: str
    agent_run_id: str
    state: RecordState
    created_at: float
    expires_at: float = 0.0
    holds_slot: bool = False
    generation: int = 0
    body: bytes = b""
    snapshot: bytes | None = None
    snapshot_size: int = 0
    snapshot_sha256: str = ""
    engine_build_id: str = ""
    lease_token: str | None = None
    lease_until: float = 0.0

    def leased(self, now: float) -> bool:
        """Whether a lease on the record is live at store time ``now``."""
        return self.lease_token is not None and self.lease_until > now

    def without_snapshot(self) -> RunRecord:
        """The same record without its snapshot bytes."""
        return replace(self, snapshot=None)


@dataclass(frozen=True)
class Park:
    """What a leg writes when its run parks (SPEC §10.4 "Parking").

    Attributes:
        run_id, session_id, agent_run_id, created_at: The run.
        body: The run's encoded state.
        snapshot: The snapshot bytes (compressed VM memory).
        engine_build_id: The engine build that made the snapshot.
        ttl_seconds: ``snapshotTtlSeconds``; the store sets ``expires_at`` = its now + this.
    """

    run_id: str
    session_id: str
    agent_run_id: str
    created_at: float
    body: bytes
    snapshot: bytes
    engine_build_id: str
    ttl_seconds: float


@dataclass(frozen=True)
class Claim:
    """The answer to a claim (SPEC §10.6 item 1, §16.1 items 4 and 6).

    Attributes:
        status: ``claimed`` (the caller now holds the lease), ``busy`` (another
            live lease), ``foreign`` (another scope), ``cancelled`` (a tombstone of
            this scope, before the run's original expiry), ``missing`` (unknown or
            expired).
        record: The record (with its snapshot when claimed; without otherwise),
            ``None`` when missing.
        taken_over: Claimed from a lease that lapsed while a leg held it: the
            replica running that leg died, and the record is its last park.
    """

    status: ClaimStatus
    record: RunRecord | None = None
    taken_over: bool = False


def refused_claim(record: RunRecord, session_id: str, agent_run_id: str, now: float) -> Claim | None:
    """The claim answer for an unexpired record that cannot be claimed, else ``None``.

    One rule for every backend (SPEC §10.6 item 1, §16.1 item 4): a cancelled run is
    ``cancelled`` to its own scope and ``missing`` to others; another scope gets
    ``foreign``; a live lease held by someone else gets ``busy``.

    Args:
        record: The stored run, already checked not to be expired.
        session_id: The claiming scope's session id.
        agent_run_id: The claiming scope's agent run id.
        now: The store clock, in seconds.
    """
    same_scope = (record.session_id, record.agent_run_id) == (session_id, agent_run_id)
    if record.state == "cancelled":
        return Claim("cancelled", record.without_snapshot()) if same_scope else Claim("missing")
    if not same_scope:
        return Claim("foreign", record.without_snapshot())
    if record.leased(now):
        return Claim("busy", record.without_snapshot())
    return None


class SlotAnswer(enum.Enum):
    """The store's answer to :meth:`RunStore.reserve_slot`; true only when the run holds a slot."""

    HELD = "held"
    DEPLOYMENT_FULL = "deployment_full"
    """The deployment's cap is reached ([R01])."""
    SCOPE_FULL = "scope_full"
    """The run's scope holds its share of the cap (:func:`~cellblock.server.limits.scope_share`, [R23])."""
    CANCELLED = "cancelled"
    """The run was cancelled (a tombstone)."""
    UNANSWERED = "unanswered"
    """Not the store's answer: it did not answer within the store wait ([R25]; ``RunRegistry.reserve_slot``)."""

    def __bool__(self) -> bool:
        return self is SlotAnswer.HELD


class RunStore(abc.ABC):
    """Durable, shared storage of runs that hold a slot or are suspended (SPEC §16.1).

    Every method is one atomic transaction. Writes by a leg name its lease token
    and do nothing when the lease was lost (taken over or cancelled), so a
    replica that lost a run can never overwrite the run's newer state.

    Args:
        cap: The deployment's suspended-run cap (SPEC §2.3, §16.1 item 5); one scope may
            hold at most ``scope_share`` of it (:func:`~cellblock.server.limits.scope_share`).
    """

    #: The ``CELLBLOCK_STORE`` scheme (``memory``, ``sqlite``, ``postgresql``).
    kind: str = ""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.scope_share = scope_share(cap)

    @abc.abstractmethod
    async def open(self) -> None:
        """Connects and applies schema migrations.

        Raises:
            StoreUnavailableError: The store cannot be reached or migrated.
        """

    @abc.abstractmethod
    async def close(self) -> None:
        """Releases connections. Idempotent."""

    @abc.abstractmethod
    async def now(self) -> float:
        """The store's clock, in epoch seconds (the database server's for PostgreSQL)."""

    @abc.abstractmethod
    async def reserve_slot(self, run_id: str, session_id: str, agent_run_id: str, created_at: float, lease_token: str, lease_seconds: float) -> SlotAnswer:
        """Takes a suspended-run slot for a run, atomically against the cap and its scope's share.

        Creates the run's ``active`` record, leased to the caller. Idempotent for a
        run that already holds a slot. The scope's held slots and the deployment's
        are counted in the same transaction (or lock) as the insert.

        Returns:
            :attr:`SlotAnswer.HELD` when the run holds a slot; else why not (nothing
            is written): its scope (``session_id``, ``agent_run_id``) already holds
            :attr:`scope_share` slots, the deployment holds ``cap``, or the run was cancelled.
        """

    @abc.abstractmethod
    async def park(self, park: Park, lease_token: str) -> float | None:
        """Stores a suspended run: record and snapshot in one transaction; frees the lease.

        The run must hold a slot (:meth:`reserve_slot`) under ``lease_token``.

        Returns:
            The new ``expires_at`` (store clock), or ``None`` when the caller no longer
            holds the run (lease lost, run cancelled or gone): nothing is written.
        """

    @abc.abstractmethod
    async def park_with_slot(self, park: Park) -> float | SlotAnswer | None:
        """Takes a suspended-run slot for a run that holds none and parks it, in one transaction.

        A run's first suspension before any dispatch (SPEC §10.4 "Parking": take a slot if
        the run has none, then store it): one store write, not a reservation and a park.
        The slot is counted against the cap and the scope's share as :meth:`reserve_slot`
        counts it; the record is written ``suspended``, unleased, with its snapshot.

        Returns:
            The new ``expires_at`` (store clock); else nothing is written and the answer
            says why: :attr:`SlotAnswer.SCOPE_FULL`, :attr:`SlotAnswer.DEPLOYMENT_FULL`,
            :attr:`SlotAnswer.CANCELLED` (the run's tombstone), or ``None`` when another
            record of the run exists.
        """

    @abc.abstractmethod
    async def claim(self, run_id: str, session_id: str, agent_run_id: str, lease_token: str, lease_seconds: float) -> Claim:
        """Claims a suspended run for a wait (one wait at a time across replicas).

        Expired records met here are deleted (a sweep of one).
        """

    @abc.abstractmethod
    async def renew(self, run_id: str, lease_token: str, lease_seconds: float) -> RenewStatus:
        """Extends the caller's lease while its leg runs."""

    @abc.abstractmethod
    async def release(self, run_id: str, lease_token: str, body: bytes | None = None) -> None:
        """Gives a claimed run back, suspended again (a wait that did not resume).

        Args:
            run_id: The run.
            lease_token: The claim's lease token (a stale one changes nothing).
            body: The run's new state document (the wait dispatched held calls), or
                ``None`` to keep the stored one. Snapshot and expiry stay as they are.
        """

    @abc.abstractmethod
    async def remove(self, run_id: str, lease_token: str | None) -> bool:
        """Deletes a run that ended, freeing its slot and snapshot.

        Args:
            run_id: The run.
            lease_token: The caller's lease; ``None`` removes only a run no live lease holds
                (scope end discarding suspended runs). A tombstone is never removed here.

        Returns:
            True when a record was deleted.
        """

    @abc.abstractmethod
    async def cancel(self, run_id: str, session_id: str, agent_run_id: str, until: float) -> None:
        """Replaces the run by a tombstone kept until ``until`` (or the run's own expiry).

        Frees the slot and snapshot at once; a leg still holding the run finds its lease
        lost (:meth:`renew` answers ``cancelled``).
        """

    @abc.abstractmethod
    async def sweep(self) -> list[RunRecord]:
        """Deletes expired records (SPEC §10.7 item 5, §16.1 item 7).

        Deleted: suspended runs past ``expires_at`` that no live lease holds; active
        records whose lease lapsed and that have no snapshot or are past expiry; tombstones
        past their time.

        Returns:
            The deleted runs (tombstones excluded), without snapshots.
        """

    async def sweep_and_count(self) -> tuple[list[RunRecord], tuple[int, int]]:
        """:meth:`sweep`, then :meth:`counts` (two transactions; a backend may send both in one round trip)."""
        return await self.sweep(), await self.counts()

    @abc.abstractmethod
    async def get(self, run_id: str) -> RunRecord | None:
        """The run's record without its snapshot, or ``None`` (tombstones included)."""

    @abc.abstractmethod
    async def list_scope(self, session_id: str, agent_run_id: str) -> list[RunRecord]:
        """The scope's active and suspended records, oldest first, without snapshots."""

    @abc.abstractmethod
    async def counts(self) -> tuple[int, int]:
        """``(slots held, suspended runs)`` in the whole deployment."""

    @abc.abstractmethod
    async def check_integrity(self) -> list[str]:
        """Problems found in the stored records; empty when the store is consistent.

        Checked: every suspended record has a snapshot whose length and SHA-256 match its
        columns and a non-empty body; no tombstone holds a slot or a snapshot; slots held
        do not exceed the cap; the backend's own check passes (SQLite ``integrity_check``).
        """
