"""Which cell a leg runs in, and whether that cell may serve the scope's next leg (SPEC §16.2).

A leg takes, in order: its scope's kept cell (only under ``CELLBLOCK_CELL_REUSE=scope``),
a warm pooled cell, or a freshly started one. At its end the cell is destroyed, unless
reuse is on and the leg ended in one of the ways §16.2 item 2 allows; anything else
(timeout, abort, out of memory, a trap or interrupt, a cell that exited, a bridge
protocol break, an unknown end) destroys it. The decision is an allow-list: what is
not known to be clean is not reused.
"""

from __future__ import annotations

from dataclasses import dataclass

from cellblock.bridge.v1 import bridge_service_pb2 as bpb
from cellblock.server.cells import Cell, CellBridge, CellSpec, CellStartError, Executor, ScopeCell, ScopeCells, WarmPool
from cellblock.server.runs._protocol import ErrorCode, LegOutcome, RunStatus

#: Guest failure kinds that are the program's own doing (its error, a rejection it
#: did not catch, a syntax error the engine found): the engine and agent are sound.
_GUEST_FAILURES = frozenset({bpb.FAILURE_KIND_GUEST_ERROR, bpb.FAILURE_KIND_BRIDGE_REJECTION, bpb.FAILURE_KIND_SYNTAX})
#: Final codes that always destroy the cell: the leg was cut short or the cell is in doubt.
_DESTROYING_CODES = frozenset({ErrorCode.TIMEOUT, ErrorCode.ABORTED, ErrorCode.RUNTIME_UNAVAILABLE})


def clean_end(end: bpb.LegEnd) -> bool:
    """Whether the guest's ``end`` leaves its cell fit for another leg (SPEC §16.2 item 2).

    Completed and suspended ends qualify (the host still checks what they carry),
    and failures of the program itself; memory exhaustion, engine traps,
    interrupts, unserialisable values, unsettleable programs and unknown ends do not.
    """
    which = end.WhichOneof("outcome")
    if which in ("completed", "suspended"):
        return True
    return which == "failed" and end.failed.kind in _GUEST_FAILURES


def reusable(outcome: LegOutcome, *, clean: bool, protocol_broken: bool, exited: bool) -> bool:
    """The whole rule: a clean end, no bridge protocol break, a live cell, and an outcome that is not cut short.

    Args:
        outcome: The leg's final outcome.
        clean: The guest's ``end`` passed :func:`clean_end` and the host accepted
            what it carried (valid value JSON, a snapshot of the announced size).
        protocol_broken: The cell sent something the bridge protocol does not allow.
        exited: The cell's process ended.
    """
    if not clean or protocol_broken or exited:
        return False
    if outcome.status in (RunStatus.COMPLETED, RunStatus.WAITING):
        return True
    return outcome.code not in _DESTROYING_CODES


@dataclass
class ChosenCell:
    """The cell of a leg.

    Attributes:
        cell: The container (or pod); ``None`` when none could be started.
        bridge: Its bridge.
        kept: Its reuse record under ``scope``, else ``None``.
        reused: Whether it served an earlier leg of the scope.
        failure: Why no cell could be had (``cell`` is then ``None``).
    """

    cell: Cell | None
    bridge: CellBridge | None
    kept: ScopeCell | None = None
    reused: bool = False
    failure: str = ""


def ready_cell(*, scope: tuple[str, str], memory_limit_bytes: int, pool: WarmPool | None, scope_cells: ScopeCells | None) -> ChosenCell | None:
    """The scope's kept cell (under ``scope``), else a warm pooled one, else ``None``."""
    if scope_cells is not None:
        kept = scope_cells.take(scope, memory_limit_bytes)
        if kept is not None:
            return ChosenCell(kept.cell, kept.bridge, kept, reused=True)
    warm = pool.acquire(memory_limit_bytes) if pool is not None else None
    if warm is None:
        return None
    return ChosenCell(warm.cell, warm.bridge)


async def fresh_cell(*, cell_id: str, memory_limit_bytes: int, executor: Executor, socket_base: str) -> ChosenCell:
    """Starts a cell for the leg.

    Returns:
        The cell; on failure ``cell`` is ``None`` and ``failure`` says why (the
        bridge, if one was opened, is returned for cleanup).
    """
    try:
        bridge = await executor.open_bridge(socket_base)
    except OSError as exc:
        return ChosenCell(None, None, failure=f"the bridge socket could not be created ({exc.__class__.__name__})")
    spec = CellSpec(cell_id=cell_id, bridge_dir=bridge.directory, cell_token=bridge.token, memory_limit_bytes=memory_limit_bytes)
    try:
        cell = await executor.start(spec)
    except CellStartError as exc:
        return ChosenCell(None, bridge, failure=str(exc))
    return ChosenCell(cell, bridge)
