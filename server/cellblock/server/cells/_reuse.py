"""Cell reuse within a scope (SPEC §16.2, ``CELLBLOCK_CELL_REUSE=scope``).

Under ``scope`` a cell whose leg ended normally may serve the next leg of the
same scope: the leg's bridge is recycled (:meth:`CellBridge.recycle`: the
cell's agent drops its VM, prepares a fresh one and attaches again with a new
one-time token), and the cell waits here, keyed by its scope, until the scope's
next leg takes it. Only the container is shared; every leg still gets a fresh
VM and its own token.

The leg decides whether its cell may be kept at all (the outcome rules of
§16.2 item 2: completed, waiting, or a guest failure, and nothing that casts
doubt on the cell); :class:`ScopeCells` enforces the rest: the cell's leg
count (``CELLBLOCK_CELL_MAX_LEGS``), its age (``CELLBLOCK_CELL_MAX_AGE_S``),
its idle time (``CELLBLOCK_CELL_IDLE_S``), the end of its scope, the service's
stop, and a bound on idle cells over all scopes (``CELLBLOCK_MAX_CONCURRENT_LEGS``). Every cell it does not keep goes to the reaper.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import InitVar, dataclass, field
from typing import TYPE_CHECKING

import structlog

from cellblock.server.cells._pool import still_serves

if TYPE_CHECKING:
    from cellblock.server.cells._base import Cell
    from cellblock.server.cells._bridge import CellBridge
    from cellblock.server.cells._reaper import CellReaper

log = structlog.get_logger("cellblock.reuse")

#: ``CELLBLOCK_CELL_REUSE`` values.
REUSE_MODES = ("leg", "scope")
#: A cell's agent waits this long for its next leg before it ends itself, so
#: an idle limit above it would keep cells that are gone (seconds).
MAX_IDLE_LIMIT_S = 60.0

Scope = tuple[str, str]


@dataclass
class ScopeCell:
    """A cell serving one scope, between legs or during one.

    Attributes:
        scope: ``(session_id, agent_run_id)`` it serves, and no other.
        cell: The container (or pod).
        bridge: Its bridge, re-armed for the next leg's token.
        memory_limit_bytes: The engine limit the cell was sized for.
        started_at: ``time.monotonic()`` of the cell's first leg.
        legs: Legs it has served.
        epoch: The scope's end count when its current leg began (see :meth:`ScopeCells.keep`).
        idle_since: ``time.monotonic()`` when it was last kept.
        exited: The cell's exit code once it ends: one waiter for all its legs.
    """

    scope: Scope
    cell: Cell
    bridge: CellBridge
    memory_limit_bytes: int
    started_at: float = field(default_factory=time.monotonic)
    legs: int = 0
    epoch: int = 0
    idle_since: float = 0.0
    exited: asyncio.Future[int] = field(init=False)
    _idle_timer: asyncio.TimerHandle | None = None
    #: The cell's exit waiter when one already runs (a pooled cell's), else one is started.
    waiter: InitVar[asyncio.Future[int] | None] = None

    def __post_init__(self, waiter: asyncio.Future[int] | None) -> None:
        self.exited = waiter if waiter is not None else asyncio.ensure_future(self.cell.wait())


class ScopeCells:
    """The idle cells of each scope.

    Args:
        reaper: Destroys every cell that is not kept.
        max_legs: Legs a cell serves at most (``CELLBLOCK_CELL_MAX_LEGS``).
        max_age_s: Seconds a cell serves at most, from its first leg (``CELLBLOCK_CELL_MAX_AGE_S``).
        idle_s: Seconds a cell waits for its scope's next leg (``CELLBLOCK_CELL_IDLE_S``).
        max_kept: Idle cells kept at most, over all scopes (``CELLBLOCK_MAX_CONCURRENT_LEGS``):
            keeping one more destroys the one idle longest.

    Attributes:
        reused: Legs served by a kept cell (each one a container start saved).
    """

    def __init__(self, reaper: CellReaper, *, max_legs: int, max_age_s: float, idle_s: float, max_kept: int) -> None:
        self._reaper = reaper
        self.max_kept = max_kept
        self.max_legs = max_legs
        self.max_age_s = max_age_s
        self.idle_s = idle_s
        self._idle: dict[Scope, list[ScopeCell]] = {}
        self._ended: dict[Scope, int] = {}
        self._closed = False
        self.reused = 0

    def begin(self, scope: Scope, cell: Cell, bridge: CellBridge, memory_limit_bytes: int, exited: asyncio.Future[int] | None = None) -> ScopeCell:
        """Records a fresh (or pooled) cell at the start of its first leg for ``scope`` (``exited``: its running exit waiter)."""
        return ScopeCell(scope, cell, bridge, memory_limit_bytes, legs=1, epoch=self._ended.get(scope, 0), waiter=exited)

    async def take(self, scope: Scope, memory_limit_bytes: int, bridge_message_bytes: int = 0, until: float = math.inf) -> ScopeCell | None:
        """The scope's idle cell for a new leg, or ``None``.

        Only a live cell of this very scope and engine limit, within its age
        limit, whose bridge reads messages as large as the new leg's run may
        send (``bridge_message_bytes``: a cell first started for a run with a
        smaller output or snapshot limit reads less), is handed out (it counts
        the new leg at once); cells of another limit stay for legs of theirs,
        exited or too old ones are destroyed. "Live" is the warm pool's check
        (:func:`still_serves`): a kept cell that was paused, signalled or lost
        its bridge stream while idle is destroyed, never handed out. The checks
        are bounded by ``until`` (``loop.time()``, the leg's cell wait): a cell
        not vouched for by then is destroyed (fail closed) and ``None`` returned.
        """
        loop = asyncio.get_running_loop()
        chosen = None
        while loop.time() < until:
            chosen = self._pick(scope, memory_limit_bytes, bridge_message_bytes)
            try:
                if chosen is None or await still_serves(chosen.cell, chosen.bridge, until):
                    break
                log.warning("cell.kept_dead", cell_id=chosen.cell.cell_id)
                self._destroy(chosen, "dead")
            except TimeoutError:
                assert chosen is not None
                log.warning("cell.kept_unknown", cell_id=chosen.cell.cell_id)
                self._destroy(chosen, "unknown")
            chosen = None
        if chosen is not None:
            chosen.legs += 1
            chosen.epoch = self._ended.get(scope, 0)
            self.reused += 1
        return chosen

    def _pick(self, scope: Scope, memory_limit_bytes: int, bridge_message_bytes: int) -> ScopeCell | None:
        """Takes the scope's first fitting idle cell out of the idle set (no await: no other leg can take it too)."""
        cells = self._idle.get(scope, [])
        now = time.monotonic()
        chosen = None
        for kept in list(cells):
            if kept.exited.done() or now - kept.started_at >= self.max_age_s:
                cells.remove(kept)
                self._cancel_idle(kept)
                self._destroy(kept, "exited" if kept.exited.done() else "max_age")
            elif chosen is None and kept.memory_limit_bytes == memory_limit_bytes and kept.bridge.max_message_bytes >= bridge_message_bytes:
                chosen = kept
        if chosen is not None:
            cells.remove(chosen)
            self._cancel_idle(chosen)
        if not cells:
            self._idle.pop(scope, None)
        return chosen

    def keep(self, kept: ScopeCell) -> bool:
        """Keeps a cell whose leg ended normally for the scope's next leg.

        The cell is destroyed instead when it served ``max_legs`` legs or
        ``max_age_s`` seconds, when its scope ended since its leg began, or
        when the service stops. A kept cell is destroyed after ``idle_s``
        seconds without a leg.

        Returns:
            True when the cell was kept (its bridge is recycled), False when destroyed.
        """
        reason = ""
        if self._closed:
            reason = "stopping"
        elif self._ended.get(kept.scope, 0) != kept.epoch:
            reason = "scope_ended"
        elif kept.legs >= self.max_legs:
            reason = "max_legs"
        elif time.monotonic() - kept.started_at >= self.max_age_s:
            reason = "max_age"
        if reason:
            self._destroy(kept, reason)
            return False
        kept.bridge.recycle()
        kept.idle_since = time.monotonic()
        idle = [c for cells in self._idle.values() for c in cells]
        for oldest in sorted(idle, key=lambda c: c.idle_since)[: max(0, len(idle) + 1 - self.max_kept)]:
            self._expire(oldest, "max_kept")
        self._idle.setdefault(kept.scope, []).append(kept)
        kept._idle_timer = asyncio.get_running_loop().call_later(self.idle_s, self._expire, kept)
        return True

    def end_scope(self, scope: Scope) -> int:
        """The scope ended (SPEC §3.6 item 3): destroys its idle cells; cells of its running legs are not kept.

        Returns:
            Idle cells destroyed.
        """
        self._ended[scope] = self._ended.get(scope, 0) + 1
        cells = self._idle.pop(scope, [])
        for kept in cells:
            self._cancel_idle(kept)
            self._destroy(kept, "scope_ended")
        return len(cells)

    def idle_cell_ids(self) -> set[str]:
        """Cell ids waiting here for their scope's next leg."""
        return {kept.cell.cell_id for cells in self._idle.values() for kept in cells}

    def close(self) -> None:
        """Destroys every idle cell and keeps none from now on (the service stops)."""
        self._closed = True
        idle, self._idle = self._idle, {}
        for cells in idle.values():
            for kept in cells:
                self._cancel_idle(kept)
                self._destroy(kept, "stopping")

    def _expire(self, kept: ScopeCell, reason: str = "idle") -> None:
        cells = self._idle.get(kept.scope, [])
        if kept in cells:
            cells.remove(kept)
            if not cells:
                self._idle.pop(kept.scope, None)
            self._cancel_idle(kept)
            self._destroy(kept, reason)

    @staticmethod
    def _cancel_idle(kept: ScopeCell) -> None:
        if kept._idle_timer is not None:
            kept._idle_timer.cancel()
            kept._idle_timer = None

    def _destroy(self, kept: ScopeCell, reason: str) -> None:
        log.debug("cell.not_reused", cell_id=kept.cell.cell_id, reason=reason, legs=kept.legs)
        self._reaper.retire(kept.cell, kept.bridge)
