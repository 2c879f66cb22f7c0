"""How a leg ends: the guest's ``end`` (a value, a snapshot, a failure) and where its cell goes.

:class:`LegEnding` is the part of :class:`~cellblock.server.runs._leg.Leg` that reads the
guest's last message (SPEC §10.4, §11) and then either hands the cell to its scope's next
leg (cell reuse, SPEC §16.2, by the rule of :mod:`~cellblock.server.runs._reuse_rule`) or
to the reaper.
"""

from __future__ import annotations

import asyncio

from cellblock.bridge.v1 import bridge_service_pb2 as bpb
from cellblock.server import messages as msg
from cellblock.server.cells import Cell, CellBridge, Executor, ScopeCell, ScopeCells
from cellblock.server.runs._final_value import completed_outcome
from cellblock.server.runs._guest_failure import guest_failure
from cellblock.server.runs._protocol import BridgeMethod, CellExited, ErrorCode, LegOutcome, RunStatus, failed
from cellblock.server.runs._reuse_rule import clean_end, reusable
from cellblock.server.runs._settle import SettleLoop
from cellblock.server.runs._snapshot_in import SnapshotIn
from cellblock.server.telemetry import LegTrace
from cellblock.server.workers import CpuPool


class LegEnding(SettleLoop):
    """The end of a leg; :class:`~cellblock.server.runs._leg.Leg` sets these attributes.

    Attributes:
        executor: Starts and retires the leg's cell.
        trace: The leg's spans.
        scope_cells: Cells kept for their scope's next leg, else ``None``.
        cpu: The worker pool (a long final value is read there).
    """

    executor: Executor
    cpu: CpuPool
    trace: LegTrace
    scope_cells: ScopeCells | None
    _cell: Cell | None
    _bridge: CellBridge | None
    _kept: ScopeCell | None
    #: A pooled cell's exit waiter (started with the cell), else ``None``.
    _exited: asyncio.Future[int] | None
    #: The engine's verdict on an exit 137.
    _out_of_memory: bool
    _outcome: LegOutcome | None
    _terminal: LegOutcome | None
    _snapshot_in: SnapshotIn
    #: The guest's end was clean and the host accepted what it carried.
    _clean_end: bool
    #: The cell broke the bridge protocol or sent what its controller should have refused.
    _in_doubt: bool
    #: The host asked the guest to suspend (``Suspend`` sent).
    _suspend_sent: bool

    async def _watch_cell(self) -> None:
        """Puts :class:`CellExited` on the leg's queue when the cell ends."""
        assert self._cell is not None
        # A kept cell has one exit waiter for all its legs; a pooled cell's started with it.
        exited = self._kept.exited if self._kept is not None else self._exited
        code = await (asyncio.shield(exited) if exited is not None else self._cell.wait())
        self._out_of_memory = code == 137 and await self._cell.out_of_memory()  # else a kill from outside (R12)
        await self.ports.events.put(CellExited(code))

    def release_cell(self) -> None:
        """Keeps the cell for the scope's next leg when the rule allows, else retires it."""
        kept, outcome = self._kept, self._outcome
        protocol_broken = self._in_doubt or self._terminal is not None
        if kept is not None and self.scope_cells is not None and outcome is not None:
            if reusable(outcome, clean=self._clean_end, protocol_broken=protocol_broken, exited=kept.exited.done()):
                self.scope_cells.keep(kept)  # or destroys it (its limits, its scope's end)
                return
        # The bridge stream closes now; the container and socket directory
        # are removed off the reply path (cells.CellReaper), a cell that ended as
        # reuse would allow a little later, any other at once.
        clean = outcome is not None and reusable(outcome, clean=self._clean_end, protocol_broken=protocol_broken, exited=False)
        self.executor.reaper.retire(self._cell, self._bridge, clean=clean)

    async def _on_end(self, end: bpb.LegEnd) -> LegOutcome:
        run = self.run_
        which = end.WhichOneof("outcome")
        if which == "completed":
            outcome = await completed_outcome(run, end.completed, self._log, self.cpu)
            self._clean_end = outcome.status is RunStatus.COMPLETED
            return outcome
        if which == "suspended":
            return await self._on_suspended(end.suspended)
        if which == "failed":
            self.abandon_dispatched()
            self._clean_end = clean_end(end)
            return guest_failure(run, end.failed, self._log)
        self._log.error("bridge.invalid_end")
        return failed(ErrorCode.INTERNAL_ERROR, msg.R17)

    async def _on_suspended(self, suspended: bpb.Suspended) -> LegOutcome:
        run = self.run_
        size = self._snapshot_in.received
        if not self._suspend_sent:
            # A suspension the host never asked for is an invalid cell response (SPEC §10.4).
            self._log.error("bridge.unasked_suspension")
            return failed(ErrorCode.INTERNAL_ERROR, msg.R17)
        if size != suspended.snapshot_bytes:
            self._log.error("bridge.snapshot_size_mismatch")
            return failed(ErrorCode.INTERNAL_ERROR, msg.R17)
        self._clean_end = True
        if self._snapshot_in.over_limit:
            self.abandon_dispatched()
            self._log.warning("snapshot.too_large", snapshot_bytes=size)
            self.trace.snapshot_stored(size, suspended.raw_bytes, error="snapshot_limit_exceeded")
            return failed(ErrorCode.SNAPSHOT_LIMIT_EXCEEDED, msg.r14(size, run.limits.max_snapshot_bytes))
        data = self._snapshot_in.data()
        # The runner parks the run: its record and snapshot in one store transaction, which
        # also takes the run's slot when it has none (no call was dispatched before).
        run.snapshot_bytes = len(data)
        self.trace.snapshot_stored(len(data), suspended.raw_bytes)
        reason = "yield" if run.pending and all(p.method is BridgeMethod.YIELD for p in run.pending.values()) else "pending_tools"
        return LegOutcome(status=RunStatus.WAITING, reason=reason, snapshot=data)
