"""Runs of this process over the deployment's run store (SPEC §10.7, §16.1).

The run store is the only source of truth for suspended runs, their slots,
leases and expiry. :class:`RunRegistry` adds what only this process can hold:
the runs whose legs run here (so CancelRun and scope end can reach them), the
lease tokens it holds, the open ``bridge.tool_call`` spans of runs it parked,
and results of cellblock-hosted calls that settled while their run was parked.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import structlog

from cellblock.server import messages as msg
from cellblock.server.limits import DEFAULT_STORE_CALL_MS, SUSPENDED_RUN_CAP
from cellblock.server.runs._codec import RunDecodeError, ViewRestorer, decode_run, encode_run, encode_run_parts, split_document
from cellblock.server.runs._policy import reject
from cellblock.server.runs._protocol import ClaimBusy, ClaimCancelled, Claimed, ClaimForeign, ClaimResult, ClaimUnknown, Provenance
from cellblock.server.runs._start import join_bytes
from cellblock.server.runs._state import PendingRequest, Run
from cellblock.server.runs._store_call import StoreCalls
from cellblock.server.store import DEFAULT_LEASE_SECONDS, Claim, MemoryRunStore, Park, RunRecord, RunStore, SlotAnswer, StoreTimeoutError
from cellblock.server.telemetry import end_open_tool_calls, end_tool_call

log = structlog.get_logger("cellblock.runs")

#: Exit code quoted in [R12] for calls of a leg lost with its replica (SPEC §16.1 item 6): the
#: cell was killed with the replica, as by SIGKILL (128 + 9).
LOST_LEG_EXIT_CODE = 137

#: ``apply(run)`` records a hosted call's outcome on ``run``; returns the settled request or ``None``.
HostedOutcome = Callable[[Run], PendingRequest | None]


@dataclass(frozen=True)
class RunSummary:
    """What RunService shows of a run, read from its record or from a leg of this process.

    Attributes:
        state: ``running`` or ``suspended``.
        pending: ``(bridge id, method, nested call id)`` in request order.
    """

    run_id: str
    session_id: str
    agent_run_id: str
    state: str
    tool_call_id: str
    created_at: float
    expires_at: float
    snapshot_bytes: int
    pending: list[tuple[str, str, str]] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    legs: int = 0


def _summary_of_run(run: Run) -> RunSummary:
    return RunSummary(
        run.run_id, run.session_id, run.agent_run_id, "running", run.tool_call_id, run.created_at, run.expires_at, run.snapshot_bytes,
        [(p.bridge_id, p.method, p.nested_call_id) for p in run.pending.values()], dict(run.counts), run.legs,
    )


def _summary_of_record(record: RunRecord, now: float) -> RunSummary:
    doc: dict[str, Any] = {}
    if record.body:
        with contextlib.suppress(ValueError):  # the head only: the catalog view is not parsed (SPEC §3.1 item 6)
            doc = split_document(record.body)[0]
    state = "suspended" if record.state == "suspended" or (record.snapshot_size and not record.leased(now)) else "running"
    return RunSummary(
        record.run_id, record.session_id, record.agent_run_id, state, str(doc.get("toolCallId", "")), record.created_at, record.expires_at,
        record.snapshot_size, [(p["bridgeId"], p["method"], p["nestedCallId"]) for p in doc.get("pending", [])], dict(doc.get("counts", {})), int(doc.get("legs", 0)),
    )


class RunRegistry:
    """This process's runs over the deployment's run store.

    Args:
        store: The opened run store (``memory:`` when omitted: tests only).
        restore_view: Rebuilds a stored run's catalog view (the API layer's ``RunCatalog``).
        lease_seconds: Lease length; renewed every third of it while a leg runs.
        store_call_s: The store wait: every store call waits at most this long, else
            :class:`~cellblock.server.store.StoreTimeoutError` (:class:`StoreCalls`).
    """

    def __init__(
        self, store: RunStore | None = None, restore_view: ViewRestorer | None = None, lease_seconds: float = DEFAULT_LEASE_SECONDS, store_call_s: float = DEFAULT_STORE_CALL_MS / 1000.0
    ) -> None:
        self.store: RunStore = store or MemoryRunStore(SUSPENDED_RUN_CAP)
        #: Bounds every store call; finishes and undoes the ones that outlive it.
        self.calls = StoreCalls(store_call_s)
        self.restore_view = restore_view
        self.lease_seconds = lease_seconds
        #: Set when the service shuts down: aborted legs hand their runs back instead of cancelling them.
        self.stopping = False
        #: Runs whose leg (exec or wait) runs in this process.
        self.active: dict[str, Run] = {}
        self._leases: dict[str, str] = {}
        #: Open nested-call spans of runs parked here, by run id, with the park's expiry.
        self._spans: dict[str, tuple[float, dict[str, Any]]] = {}
        self._hosted: dict[str, list[HostedOutcome]] = {}
        #: Slot reservations the store is still answering, by run id (a leg may end meanwhile).
        self._reserving: dict[str, asyncio.Future[SlotAnswer]] = {}
        #: ``(slots held, suspended runs)`` in the deployment at the last sweep (metrics).
        self.counts: tuple[int, int] = (0, 0)

    @property
    def cap(self) -> int:
        """The deployment's suspended-run cap."""
        return self.store.cap

    def _token(self, run: Run) -> str:
        return self._leases.setdefault(run.run_id, secrets.token_hex(16))

    # ------------------------------------------------------------------ slots and parking
    async def reserve_slot(self, run: Run) -> SlotAnswer:
        """Gives ``run`` a slot if the deployment has one free and its scope is under its share.

        Returns:
            :attr:`SlotAnswer.HELD` (true) when it holds one, else the store's refusal (false), or
            :attr:`SlotAnswer.UNANSWERED` when the store did not answer within the store wait (a later
            answer's slot is given back).
        """
        if run.holds_slot:
            return SlotAnswer.HELD
        pending = self._reserving.get(run.run_id)
        if pending is None:
            pending = asyncio.ensure_future(self.store.reserve_slot(run.run_id, run.session_id, run.agent_run_id, run.created_at, self._token(run), self.lease_seconds))
            self._reserving[run.run_id] = pending
        # Shielded: when the leg ends while the store answers, remove() takes the answer.
        try:
            reserved = await self._settled_slot(run, pending)
        except StoreTimeoutError:
            return SlotAnswer.UNANSWERED
        self._reserving.pop(run.run_id, None)
        if reserved:
            run.holds_slot = True
        return SlotAnswer.HELD if run.holds_slot else reserved

    async def _settle_reservation(self, run: Run) -> None:
        """Waits for a slot reservation still in flight, so that an ending run frees what it got."""
        pending = self._reserving.pop(run.run_id, None)
        if pending is not None:
            with contextlib.suppress(Exception):
                if await self._settled_slot(run, pending):
                    run.holds_slot = True

    async def _settled_slot(self, run: Run, pending: asyncio.Future[SlotAnswer]) -> SlotAnswer:
        """The reservation's answer within the store wait; one that comes later is given back (the leg failed [R25])."""
        token = self._token(run)

        async def give_back(_answer: SlotAnswer | None) -> None:
            await self.store.remove(run.run_id, token)  # a slot it got, or maybe got (raised): freed

        try:
            # A cancelled awaiter leaves the answer to the others (remove() takes it).
            return await self.calls.bounded(pending, give_back, "reserve_slot", undo_on_error=True, undo_on_cancel=False)
        except StoreTimeoutError:
            self._reserving.pop(run.run_id, None)
            raise

    def add(self, run: Run) -> None:
        """Registers a run whose leg runs here (CancelRun and scope end find it)."""
        self.active[run.run_id] = run

    async def park(self, run: Run, snapshot: bytes) -> SlotAnswer | None:
        """Stores the suspended run and its snapshot in one transaction (SPEC §16.1 item 2).

        A run without a slot takes it in the same transaction (SPEC §10.4 "Parking"):
        one store write for a first suspension, not a reservation and a park. One
        whose reservation is still in flight (a dispatch asked) gets that answer first.
        Sets ``expires_at`` from the store's clock.

        Returns:
            :attr:`SlotAnswer.HELD` when parked; the store's refusal of a slot
            (nothing stored: [R01], [R23], [R25]); ``None`` when this process no longer
            holds the run (its lease was taken over, or it was cancelled): nothing was stored.
        """
        if not run.holds_slot and run.run_id in self._reserving:
            reserved = await self.reserve_slot(run)
            if not reserved:
                self.active.pop(run.run_id, None)
                return reserved
        # A document of tens of MB (a large catalog view) is concatenated in a thread (runs.join_bytes).
        park = Park(run.run_id, run.session_id, run.agent_run_id, run.created_at, await join_bytes(encode_run_parts(run)), snapshot, run.engine_build_id, run.limits.snapshot_ttl_seconds)
        token = self._token(run)
        take_slot = not run.holds_slot

        async def unpark(_stored: float | SlotAnswer | None) -> None:
            # The leg answered [R25]: the run is ended whatever the late park did (parked, refused or failed).
            await self.store.remove(run.run_id, token)
            await self.store.remove(run.run_id, None)

        call = self.store.park_with_slot(park) if take_slot else self.store.park(park, token)
        try:
            stored = await self.calls.bounded(call, unpark, "park", undo_on_error=True)
        finally:
            self.active.pop(run.run_id, None)
            self._leases.pop(run.run_id, None)
        if isinstance(stored, SlotAnswer):
            return stored
        if stored is None:
            return None
        run.holds_slot = True
        run.expires_at = stored
        run.suspended = True
        if run.tool_spans:
            self._spans[run.run_id] = (stored, run.tool_spans)
        return SlotAnswer.HELD

    # ------------------------------------------------------------------ claims and leases
    async def claim(self, run_id: str, session_id: str, agent_run_id: str) -> ClaimResult:
        """Claims a suspended run for a wait and rebuilds it from its record.

        A run taken over from a replica that died mid-leg resumes from its last park;
        the calls that leg had dispatched are answered with [R12]'s text (SPEC §16.1 item 6).

        Returns:
            :class:`Claimed` with the run and its snapshot; :class:`ClaimBusy` when another
            wait holds its lease; :class:`ClaimForeign` for another scope's run;
            :class:`ClaimCancelled` for the scope's cancelled run; :class:`ClaimUnknown`
            when it is unknown or expired.

        Raises:
            RunDecodeError: The stored run cannot be read (the claim is released).
        """
        token = secrets.token_hex(16)
        # A wait cancelled, or answered [R25], while the store answers gives back what it got.
        claim = await self.calls.bounded(self.store.claim(run_id, session_id, agent_run_id, token, self.lease_seconds), lambda c: self._give_back(c, run_id, token), "claim")
        match claim.status:
            case "busy":
                return ClaimBusy()
            case "foreign":
                return ClaimForeign(claim.record is None or claim.record.session_id != session_id)
            case "cancelled":
                return ClaimCancelled()
            case "missing":
                return ClaimUnknown()
        if claim.record is None:
            return ClaimUnknown()
        if self.restore_view is None:
            await self.calls.bounded(self.store.release(run_id, token), what="release")
            raise RunDecodeError("this registry cannot restore catalog views")
        try:
            run = decode_run(claim.record, self.restore_view)
        except RunDecodeError:
            await self.calls.bounded(self.store.release(run_id, token), what="release")
            raise
        self._leases[run_id] = token
        self.active[run_id] = run
        kept = self._spans.pop(run_id, None)
        if kept is not None and kept[0] == claim.record.expires_at and not claim.taken_over:
            run.tool_spans = kept[1]
        if claim.taken_over:
            self._reject_lost_leg(run)
        for apply in self._hosted.pop(run_id, []):
            apply(run)
        return Claimed(run, claim.record.snapshot)

    async def _give_back(self, claim: Claim, run_id: str, token: str) -> None:
        """Undoes a claim whose wait was cancelled before it learnt the answer, so the run is not busy until its lease lapses.

        A parked run is suspended again as it was; one taken over from a lapsed lease keeps
        its lapsed lease, so the next wait takes it over in turn (SPEC §16.1 item 6).
        """
        if claim.status != "claimed":
            return
        if claim.taken_over:
            await self.store.renew(run_id, token, 0.0)
        else:
            await self.store.release(run_id, token)

    def _reject_lost_leg(self, run: Run) -> None:
        now = time.monotonic()
        for p in run.pending.values():
            if p.dispatched and p.nested_call_id and p.result is None:
                reject(run, p, msg.r12(LOST_LEG_EXIT_CODE), Provenance.INTERNAL, "", now)
                end_tool_call(run, p.nested_call_id, "error", "leg_lost")
        log.warning("run.taken_over", run_id=run.run_id, rejected=sum(1 for p in run.pending.values() if p.result is not None))

    async def release_claim(self, run: Run) -> None:
        """Gives the run back (a wait that did not resume, SPEC §10.6 item 5).

        The stored state is replaced by the run's (calls the wait dispatched stay
        dispatched); snapshot and expiry are unchanged.
        """
        token = self._leases.pop(run.run_id, None)
        self.active.pop(run.run_id, None)
        if run.tool_spans:
            self._spans[run.run_id] = (run.expires_at, run.tool_spans)
        if token is not None:
            # Late: the run is suspended again once the store answers, as the wait answered.
            await self.calls.bounded(self.store.release(run.run_id, token, encode_run(run)), what="release")

    @contextlib.asynccontextmanager
    async def holding(self, run: Run, on_lost: Callable[[str], None]) -> AsyncIterator[None]:
        """Renews the run's lease while the body (a leg) runs (SPEC §16.1 item 4).

        Args:
            run: The run the leg serves (renewed once it holds a slot).
            on_lost: Called with ``"cancelled"`` or ``"lost"`` when the store says the
                run was cancelled elsewhere or taken over; the caller aborts the leg.
        """

        async def renew() -> None:
            while True:
                await asyncio.sleep(self.lease_seconds / 3)
                token = self._leases.get(run.run_id)
                if token is None or not run.holds_slot:
                    continue
                try:
                    status = await self.calls.bounded(self.store.renew(run.run_id, token, self.lease_seconds), what="renew")
                except Exception as exc:  # noqa: BLE001 - a store hiccup: try again next tick
                    log.warning("lease.renew_failed", run_id=run.run_id, error=exc.__class__.__name__)
                    continue
                if status != "ok":
                    log.warning("lease.lost", run_id=run.run_id, status=status)
                    on_lost(status)
                    return

        task = asyncio.ensure_future(renew())
        try:
            yield
        finally:
            task.cancel()

    # ------------------------------------------------------------------ ends
    async def remove(self, run: Run) -> None:
        """Forgets a terminal run and frees its slot and snapshot (one still being reserved too)."""
        await self._settle_reservation(run)
        token = self._leases.pop(run.run_id, None)
        self.active.pop(run.run_id, None)
        self._hosted.pop(run.run_id, None)
        held, run.holds_slot, run.suspended = run.holds_slot, False, False
        try:
            if held and token is not None:
                # Late: the removal ends in the background (the caller answers [R25]).
                await self.calls.bounded(self.store.remove(run.run_id, token), what="remove")
        finally:
            end_open_tool_calls(run)

    async def hand_back(self, run: Run) -> None:
        """Gives up a run whose leg the service's shutdown aborted, as a dying replica would (SPEC §16.1 item 6).

        The stored record (the last park, when there is one) stays; the lease lapses at
        once, so a wait on any replica resumes the run from its last park without waiting
        for the lease to expire. A run that never parked is swept.
        """
        await self._settle_reservation(run)
        token = self._leases.pop(run.run_id, None)
        self.active.pop(run.run_id, None)
        held, run.holds_slot = run.holds_slot, False
        try:
            if held and token is not None:
                await self.calls.bounded(self.store.renew(run.run_id, token, 0.0), what="hand_back")
        finally:
            end_open_tool_calls(run)

    async def discard(self, run_id: str) -> bool:
        """Removes a suspended run no leg holds (scope end). True when one was removed."""
        self._end_kept_spans(run_id)
        return await self.calls.bounded(self.store.remove(run_id, None), what="discard")

    async def cancel(self, run: Run) -> None:
        """Discards a run so waits report ``aborted`` until its original expiry (SPEC §3.6)."""
        run.cancelled = True
        await self.cancel_id(run.run_id, run.session_id, run.agent_run_id, run.expires_at, run.limits.snapshot_ttl_seconds)
        await self.remove(run)

    async def cancel_id(self, run_id: str, session_id: str, agent_run_id: str, expires_at: float, ttl_seconds: float) -> None:
        """Leaves a tombstone for ``run_id`` (a leg elsewhere learns it at its next renewal)."""
        until = expires_at or (await self.calls.bounded(self.store.now(), what="now") + ttl_seconds)
        await self.calls.bounded(self.store.cancel(run_id, session_id, agent_run_id, until), what="cancel")
        self._end_kept_spans(run_id)

    def _end_kept_spans(self, run_id: str) -> None:
        kept = self._spans.pop(run_id, None)
        if kept is not None:
            holder = Run(run_id, "", "", "", "", "", None, False, None, None)  # type: ignore[arg-type]
            holder.tool_spans = kept[1]
            end_open_tool_calls(holder)

    async def sweep(self) -> list[RunRecord]:
        """Deletes expired runs deployment-wide (any replica sweeps, SPEC §16.1 item 7)."""
        swept, self.counts = await self.calls.bounded(self.store.sweep_and_count(), what="sweep")
        for record in swept:
            self._end_kept_spans(record.run_id)
            self._hosted.pop(record.run_id, None)
        return swept

    # ------------------------------------------------------------------ hosted calls
    def deliver_hosted(self, run_id: str, apply: HostedOutcome, on_settled: Callable[[str], None]) -> None:
        """Records a cellblock-hosted call's outcome on its run.

        On the run of a leg running here at once (then ``on_settled(bridge_id)``);
        otherwise kept until a wait in this process claims the run.
        """
        run = self.active.get(run_id)
        if run is None:
            self._hosted.setdefault(run_id, []).append(apply)
            return
        settled = apply(run)
        if settled is not None:
            on_settled(settled.bridge_id)

    # ------------------------------------------------------------------ reads
    async def record(self, run_id: str) -> RunRecord | None:
        """The run's stored record without its snapshot (tombstones included), or ``None``."""
        return await self.calls.bounded(self.store.get(run_id), what="get")

    async def summary(self, run_id: str) -> RunSummary | None:
        """The run as RunService shows it: from the store, else from a leg of this process."""
        record = await self.record(run_id)
        if record is not None and record.state != "cancelled":
            local = self.active.get(run_id)
            return _summary_of_run(local) if local is not None else _summary_of_record(record, await self.calls.bounded(self.store.now(), what="now"))
        local = self.active.get(run_id)
        return _summary_of_run(local) if local is not None and record is None else None

    async def of_scope(self, session_id: str, agent_run_id: str) -> list[RunSummary]:
        """The scope's runs on every replica, oldest first."""
        now = await self.calls.bounded(self.store.now(), what="now")
        found = {r.run_id: _summary_of_record(r, now) for r in await self.calls.bounded(self.store.list_scope(session_id, agent_run_id), what="list_scope")}
        for run in self.active.values():
            if (run.session_id, run.agent_run_id) == (session_id, agent_run_id) and not run.cancelled:
                found[run.run_id] = _summary_of_run(run)
        return sorted(found.values(), key=lambda s: (s.created_at, s.run_id))
