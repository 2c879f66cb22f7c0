"""Suspended runs and their slots (SPEC §10.7), in service memory only.

At most 64 runs per service instance hold a slot. A run takes one at its
first dispatch or first suspension, whichever comes first, and keeps it until
it ends. A `wait` claims a suspended run atomically, so of two concurrent
waits exactly one proceeds.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from cellblock.server.limits import SUSPENDED_RUN_CAP
from cellblock.server.runs._protocol import ClaimBusy, Claimed, ClaimResult, ClaimUnknown
from cellblock.server.runs._state import Run
from cellblock.server.store import InMemorySnapshotStore, SnapshotStore
from cellblock.server.telemetry import end_open_tool_calls


@dataclass
class _Tombstone:
    """A cancelled run, remembered until its original expiry (SPEC §3.6)."""

    session_id: str
    agent_run_id: str
    expires_at: float


class RunRegistry:
    """Holds active and suspended runs of one service instance.

    Not thread-safe; used from the event loop only (claims are atomic because
    nothing awaits between the check and the update).
    """

    def __init__(self, cap: int = SUSPENDED_RUN_CAP, store: SnapshotStore | None = None) -> None:
        self.cap = cap
        #: Where suspended runs' snapshots are kept.
        self.store: SnapshotStore = store or InMemorySnapshotStore()
        self.runs: dict[str, Run] = {}
        self.claimed: set[str] = set()
        self.slots: set[str] = set()
        self.cancelled: dict[str, _Tombstone] = {}

    def reserve_slot(self, run: Run) -> bool:
        """Gives ``run`` a slot if one is free; True when it holds one."""
        if run.holds_slot:
            return True
        if len(self.slots) >= self.cap:
            return False
        self.slots.add(run.run_id)
        run.holds_slot = True
        return True

    def add(self, run: Run) -> None:
        """Registers an active run (so CancelRun and scope end can find it)."""
        self.runs[run.run_id] = run

    def park(self, run: Run, ttl_seconds: int) -> None:
        """Stores a suspended run with a fresh expiry."""
        run.expires_at = time.time() + ttl_seconds
        self.runs[run.run_id] = run
        self.claimed.discard(run.run_id)

    def release_claim(self, run: Run) -> None:
        """Lets another wait claim the run again (a wait that did not resume)."""
        self.claimed.discard(run.run_id)

    def claim(self, run_id: str) -> ClaimResult:
        """Claims a suspended run for a wait.

        Returns:
            :class:`Claimed` with the run; :class:`ClaimBusy` when another wait
            holds it; :class:`ClaimUnknown` when it is unknown or expired.
        """
        self.sweep()
        run = self.runs.get(run_id)
        if run is None or not run.suspended:
            return ClaimUnknown()
        if run_id in self.claimed:
            return ClaimBusy(run)
        self.claimed.add(run_id)
        return Claimed(run)

    def remove(self, run: Run) -> None:
        """Forgets a terminal run and frees its slot."""
        self.runs.pop(run.run_id, None)
        self.claimed.discard(run.run_id)
        self.slots.discard(run.run_id)
        run.holds_slot = False
        run.suspended = False
        self.store.delete(run.run_id)
        end_open_tool_calls(run)

    def cancel(self, run: Run) -> None:
        """Discards a run so waits report ``aborted`` until its expiry."""
        run.cancelled = True
        expires = run.expires_at or (time.time() + run.limits.snapshot_ttl_seconds)
        self.cancelled[run.run_id] = _Tombstone(run.session_id, run.agent_run_id, expires)
        self.remove(run)

    def sweep(self) -> list[Run]:
        """Removes expired suspended runs and old tombstones; returns the runs."""
        now = time.time()
        expired = [r for r in self.runs.values() if r.suspended and r.expires_at and r.expires_at <= now and r.run_id not in self.claimed]
        for run in expired:
            self.remove(run)
        for run_id in [k for k, t in self.cancelled.items() if t.expires_at <= now]:
            del self.cancelled[run_id]
        return expired

    def of_scope(self, session_id: str, agent_run_id: str) -> list[Run]:
        """The scope's runs, oldest first."""
        runs = [r for r in self.runs.values() if r.session_id == session_id and r.agent_run_id == agent_run_id]
        return sorted(runs, key=lambda r: r.created_at)
