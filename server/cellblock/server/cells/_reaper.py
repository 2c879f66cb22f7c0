"""Destroys the cells whose leg ended, off the leg's reply path.

Removing a container (``docker rm -f``) costs hundreds of milliseconds on a
busy engine, and stopping a cell's bridge server waits out its grace period.
Neither has to delay the reply: at the leg's end the reaper closes the
bridge stream at once (the cell can no longer send or receive anything, and
its one-time token was spent at attach), then removes the container and the
socket directory in the background. The service awaits every removal before
it stops (:meth:`CellReaper.drain`), so nothing outlives the service, and
:attr:`CellReaper.retiring` names the cells still being removed.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING

import structlog

if TYPE_CHECKING:
    from cellblock.server.cells._base import Cell
    from cellblock.server.cells._bridge import CellBridge

log = structlog.get_logger("cellblock.reaper")


class CellReaper:
    """Background destruction of ended cells.

    Attributes:
        retiring: Ids of cells whose leg ended and whose removal is under way.
    """

    def __init__(self) -> None:
        self.retiring: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    def retire(self, cell: Cell | None, bridge: CellBridge | None) -> None:
        """Cuts the cell off now and removes it in the background.

        Args:
            cell: The cell to remove (``None`` when it never started).
            bridge: Its bridge; the stream closes before this returns.
        """
        if bridge is not None:
            bridge.hang_up()
        if cell is not None:
            self.retiring.add(cell.cell_id)
        task = asyncio.ensure_future(self._destroy(cell, bridge))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _destroy(self, cell: Cell | None, bridge: CellBridge | None) -> None:
        try:
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
        """Waits until every retired cell is removed."""
        while self._tasks:
            with contextlib.suppress(Exception):
                await asyncio.gather(*list(self._tasks), return_exceptions=True)
