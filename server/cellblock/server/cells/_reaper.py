"""Destroys the cells whose leg ended, off the leg's reply path.

Removing a container (``docker rm -f``) costs hundreds of milliseconds on a
busy engine, and stopping a cell's bridge server waits out its grace period.
Neither has to delay the reply: at the leg's end the reaper closes the
bridge stream at once (the cell can no longer send or receive anything, and
its one-time token was spent at attach), then removes the container and the
socket directory in the background. The service awaits every removal before
it stops (:meth:`CellReaper.drain`), so nothing outlives the service, and
:attr:`CellReaper.retiring` names the cells still being removed.

A cell whose leg ended cleanly (its agent exits by itself once the stream
closes) is removed :data:`CLEAN_REMOVAL_DEFER_S` after its leg's end, not at
once: the engine's work for a removal (the container's kill, its cgroup and
overlay mount torn down, 10-30 ms of CPU in dockerd, containerd and runc on
2 cores) then does not compete with the leg's own reply (the run store's
fsync of a finished run) nor with the scope's next leg sent right after it
(a wait sent as its exec returned ``waiting``). Any other cell is removed at
once (fail closed: a runaway or misbehaving cell gets no grace).

Such a cell's stream also closes :data:`CLEAN_HANGUP_DEFER_S` after its leg's
end, not at once: the agent exits as its stream closes, and the engine's work
for the exit (containerd and dockerd record the container's state, on the
same disk) made the run store's fsync right after the leg (a finished run's
removal, a park) 2-4x slower when it ran beside it (bench/README.md). Meanwhile
the host sends the cell nothing and drops whatever the cell sends.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from typing import TYPE_CHECKING

import structlog

if TYPE_CHECKING:
    from cellblock.server.cells._base import Cell
    from cellblock.server.cells._bridge import CellBridge

log = structlog.get_logger("cellblock.reaper")

#: Seconds between a cleanly ended leg and its cell's removal (see the module docstring).
CLEAN_REMOVAL_DEFER_S = 0.2
#: Seconds between a cleanly ended leg and the end of its cell's stream (at most the removal's deferral).
CLEAN_HANGUP_DEFER_S = 0.05


def _drop(_message: object) -> None:
    """Where a retired cell's messages go while its stream stays open: nowhere."""


class CellReaper:
    """Background destruction of ended cells.

    Attributes:
        retiring: Ids of cells whose leg ended and whose removal is under way (or deferred).
        clean_defer_s: Seconds a cleanly ended cell's removal waits (:data:`CLEAN_REMOVAL_DEFER_S`; 0: none).
        clean_hangup_s: Seconds a cleanly ended cell's stream stays open (:data:`CLEAN_HANGUP_DEFER_S`,
            capped at ``clean_defer_s``).
    """

    def __init__(self) -> None:
        self.retiring: set[str] = set()
        self.clean_defer_s = CLEAN_REMOVAL_DEFER_S
        self.clean_hangup_s = CLEAN_HANGUP_DEFER_S
        self._tasks: set[asyncio.Task[None]] = set()
        #: One future per deferred removal; :meth:`drain` resolves them, so those removals start at once.
        self._deferred: set[asyncio.Future[None]] = set()

    def retire(self, cell: Cell | None, bridge: CellBridge | None, *, clean: bool = False) -> None:
        """Cuts the cell off now and removes it in the background.

        Args:
            cell: The cell to remove (``None`` when it never started).
            bridge: Its bridge; the stream closes before this returns, or for a clean
                end :attr:`clean_hangup_s` later (what the cell sends meanwhile is dropped).
            clean: The cell's leg ended cleanly: its removal waits :attr:`clean_defer_s`
                (or until :meth:`drain`); otherwise it starts at once.
        """
        defer_s = self.clean_defer_s if clean and cell is not None else 0.0
        hangup_s = min(self.clean_hangup_s, defer_s)
        if bridge is not None:
            if hangup_s > 0:
                bridge.deliver_to(_drop)
            else:
                bridge.hang_up()
        if cell is not None:
            self.retiring.add(cell.cell_id)
        task = asyncio.ensure_future(self._destroy(cell, bridge, defer_s, hangup_s))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def retire_when_started(self, starting: asyncio.Future[Cell], bridge_dir: str) -> None:
        """Removes a cell whose start finishes after its leg gave up waiting for it (no cell leaks).

        The engine recreates a missing bind-mount source, so the bridge directory
        (``bridge_dir``) is removed again once the cell is gone. :meth:`drain` waits
        for this removal like any other.
        """
        task = asyncio.ensure_future(self._destroy_started(starting, bridge_dir))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _destroy_started(self, starting: asyncio.Future[Cell], bridge_dir: str) -> None:
        await asyncio.wait({starting})
        if not starting.cancelled() and starting.exception() is None:  # else nothing was started
            cell = starting.result()
            self.retiring.add(cell.cell_id)
            await self._destroy(cell, None, 0.0)
        shutil.rmtree(bridge_dir, ignore_errors=True)

    async def _destroy(self, cell: Cell | None, bridge: CellBridge | None, defer_s: float, hangup_s: float = 0.0) -> None:
        try:
            if defer_s > 0:
                hurry = asyncio.get_running_loop().create_future()
                self._deferred.add(hurry)
                try:
                    if hangup_s > 0:
                        await asyncio.wait((hurry,), timeout=hangup_s)
                        if bridge is not None:
                            bridge.hang_up()
                    if not hurry.done():
                        await asyncio.wait((hurry,), timeout=defer_s - hangup_s)
                finally:
                    self._deferred.discard(hurry)
                    if bridge is not None:
                        bridge.hang_up()
            if cell is not None:
                try:
                    await cell.remove()
                except Exception as exc:  # noqa: BLE001 - cleanup must go on
                    log.error("cell.remove_failed", cell_id=cell.cell_id, error=exc.__class__.__name__)
            if bridge is not None:
                await bridge.close()
        finally:
            if cell is not None:
                self.retiring.discard(cell.cell_id)

    async def drain(self) -> None:
        """Waits until every retired cell is removed; deferred removals start at once."""
        while self._tasks:
            for hurry in list(self._deferred):
                if not hurry.done():
                    hurry.set_result(None)
            with contextlib.suppress(Exception):
                await asyncio.gather(*list(self._tasks), return_exceptions=True)
