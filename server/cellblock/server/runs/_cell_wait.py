"""Waiting for a leg's cell, bounded on its own and outside the program's budget (SPEC §10.2 item 3, [R21]).

Taking a pooled or kept cell, a fresh cell's start and its attach share one bound
(``CELLBLOCK_CELL_WAIT_MS``); once it is spent the engine is asked at most
:data:`~cellblock.server.limits.VERDICT_S` more about a cell that never attached. A start
that outlives the bound is not abandoned: the cell is removed once the engine has started
it (:meth:`CellReaper.retire_when_started`), so a slow engine leaks no cells or socket
directories. Nothing of a failed start is awaited on the leg's reply path: its bridge goes
to the reaper too, and the service's stop waits for both.
"""

from __future__ import annotations

import asyncio

from structlog.typing import FilteringBoundLogger

from cellblock.server import messages as msg
from cellblock.server.cells import Cell, CellBridge, CellSpec, CellStartError, Executor
from cellblock.server.config import Limits
from cellblock.server.limits import VERDICT_S
from cellblock.server.runs._protocol import Cancelled, CellExited, ErrorCode, LegOutcome, failed
from cellblock.server.runs._settle import SettleLoop


def wait_exceeded(log: FilteringBoundLogger, phase: str, cell_wait_s: float) -> LegOutcome:
    """The [R21] outcome of a leg whose cell was not ready within the cell wait."""
    log.warning("cell.wait_exceeded", phase=phase)
    return failed(ErrorCode.RUNTIME_UNAVAILABLE, msg.r21(int(cell_wait_s * 1000)))


async def start_cell(executor: Executor, spec: CellSpec, wait_until: float, cell_wait_s: float, log: FilteringBoundLogger) -> Cell | LegOutcome:
    """Starts a fresh cell, waiting at most until ``wait_until`` (``loop.time()``).

    Returns:
        The started cell, or the leg's failed outcome: [R21] when the wait ran out
        (the cell is removed once it starts), [R11] when the engine refused it.
    """
    loop = asyncio.get_running_loop()
    starting = asyncio.ensure_future(executor.start(spec))
    try:
        done, _ = await asyncio.wait({starting}, timeout=max(0.0, wait_until - loop.time()))
    except asyncio.CancelledError:
        executor.reaper.retire_when_started(starting, spec.bridge_dir)
        raise
    if not done:
        executor.reaper.retire_when_started(starting, spec.bridge_dir)
        return wait_exceeded(log, "start", cell_wait_s)
    try:
        return starting.result()
    except CellStartError as exc:
        log.error("cell.start_failed", reason=str(exc))
        return failed(ErrorCode.RUNTIME_UNAVAILABLE, msg.r11(str(exc)))


async def await_attach(leg: SettleLoop, cell: Cell, attached: asyncio.Future[object], wait_until: float, cell_wait_s: float, log: FilteringBoundLogger) -> LegOutcome | None:
    """Waits until ``wait_until`` for the cell to authenticate, exit, or the caller to cancel.

    Other events wait on the leg's queue for its settle loop (:meth:`SettleLoop.hold_events_until`).
    When the wait runs out, the engine is asked, for at most :data:`VERDICT_S`, whether the cell
    still runs: one that is paused or stopped failed to start ([R11]); a running cell that is
    still getting ready, or one the engine gave no verdict on in time, means the service is
    busy ([R21]). Either way the leg's cleanup removes the cell.

    Returns:
        ``None`` once attached, else the leg's failed outcome ([R21], [R11], [R12]/[R13], aborted).
    """
    try:
        first = await leg.hold_events_until(attached, max(0.0, wait_until - asyncio.get_running_loop().time()))
    except TimeoutError:
        try:
            alive = await asyncio.wait_for(cell.alive(), timeout=VERDICT_S)
        except TimeoutError:
            log.warning("cell.verdict_unknown", verdict_s=VERDICT_S)
            alive = True  # no verdict in time: busy, never a failed start
        if not alive:
            log.error("cell.not_running_before_attach")
            return failed(ErrorCode.RUNTIME_UNAVAILABLE, msg.r11(msg.cell_stopped_before_attach(int(cell_wait_s * 1000))))
        return wait_exceeded(log, "attach", cell_wait_s)
    match first:
        case CellExited(code=code):
            log.error("cell.exited_before_attach", exit_code=code)
            return failed(ErrorCode.RUNTIME_UNAVAILABLE, msg.r12(code) if code else msg.R13)
        case Cancelled(reason=reason):
            return failed(ErrorCode.ABORTED, msg.aborted(reason))
    return None


async def fresh_cell(
    executor: Executor,
    socket_base: str,
    cell_id: str,
    limits: Limits,
    wait_until: float,
    cell_wait_s: float,
    log: FilteringBoundLogger,
) -> tuple[CellBridge, Cell] | LegOutcome:
    """Opens a bridge socket directory under ``socket_base`` and starts a fresh cell on it.

    The bridge reads no message over the run's ``bridge_message_bytes`` (SPEC §2.3).

    Returns:
        The bridge and the started cell, or the leg's failed outcome ([R11], [R21]); on a
        failure the bridge is handed to the executor's reaper (its stream ends now, its
        server and directory go in the background: the leg's answer waits for neither).
    """
    try:
        bridge = await executor.open_bridge(socket_base, limits.bridge_message_bytes)
    except OSError as exc:
        return failed(ErrorCode.RUNTIME_UNAVAILABLE, msg.r11(f"the bridge socket could not be created ({exc.__class__.__name__})"))
    spec = CellSpec(cell_id=cell_id, bridge_dir=bridge.directory, cell_token=bridge.token, memory_limit_bytes=limits.memory_limit_bytes)
    try:
        started = await start_cell(executor, spec, wait_until, cell_wait_s, log)
    except BaseException:
        executor.reaper.retire(None, bridge)
        raise
    if isinstance(started, LegOutcome):
        executor.reaper.retire(None, bridge)
        return started
    return bridge, started
