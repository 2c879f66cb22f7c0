"""A warm pool of started, locked-down cells that already attached to their bridge.

Starting a container and its guest agent takes most of a leg's fixed cost
(DESIGN.md §2 step 3). The pool keeps a few cells ready: each is a normal cell
(same image, same lockdown, its own socket and one-time token) whose agent has
authenticated and waits for its ``start`` message. A leg takes one, uses it
once and destroys it, exactly like a fresh cell, so no cell ever sees two
runs. The pool refills in the background, a moment after a leg took a cell
(:data:`REFILL_DEFER_S`), with cells that start at a low CPU weight
(:attr:`CellSpec.ahead`); when it is empty a leg starts a fresh cell as before
(the pool never changes isolation, only latency).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import math
import secrets
import time
from dataclasses import dataclass, field

import structlog

from cellblock.server.cells._base import Cell, CellSpec, CellStartError, Executor
from cellblock.server.cells._bridge import CellBridge
from cellblock.server.config import pooled_bridge_message_bytes
from cellblock.server.limits import ATTACH_TIMEOUT_S, POOL_CLOSE_S

log = structlog.get_logger("cellblock.pool")

#: Seconds a warm cell may wait before it is replaced (its agent gives up
#: waiting for ``start`` after about 90 s).
MAX_IDLE_S = 60.0
#: Window over which the pool measures the leg rate, in seconds.
RATE_WINDOW_S = 10.0
#: Most cells the pool starts at once: it grows step by step, so a burst
#: never doubles the engine's container churn on top of the legs' own starts.
MAX_STARTING = 2
#: Seconds a refill waits after a leg took a cell: a cell's start (engine work,
#: the bridge server, then the agent's start-up) would compete for the CPU with
#: the leg just begun and the next one (a wait sent right after its exec). Counted
#: from the first take, never extended; a leg that finds the pool empty (a miss,
#: it starts its own cell) refills at once.
REFILL_DEFER_S = 0.2


async def still_serves(cell: Cell, bridge: CellBridge, until: float = math.inf) -> bool:
    """Whether a cell waiting for its next leg (pooled or kept) may be handed one.

    Its bridge stream has not ended (the agent is gone, or hung: a warm cell's
    bridge ends its stream when a ping goes unanswered) and holds no message
    from an idle agent, and the cell still runs unpaused (:meth:`Cell.alive`:
    for Docker cells the engine's event stream, else the engine itself).

    Args:
        cell: The cell.
        bridge: Its attached bridge.
        until: ``loop.time()`` by which the answer is needed (the leg's cell wait, SPEC §10.2
            item 3); ``math.inf``: the engine's own bound (``CELL_STATE_CHECK_S``).

    Raises:
        TimeoutError: The engine did not answer by ``until`` (the cell's state is unknown).
    """
    if bridge.inbox.qsize():
        return False
    if until == math.inf:
        return await cell.alive()
    left = until - asyncio.get_running_loop().time()
    if left <= 0:
        raise TimeoutError
    return await asyncio.wait_for(cell.alive(), timeout=left)


def exit_waiter(cell: Cell) -> asyncio.Future[int]:
    """The cell's exit code once it ends: its one waiter, started now (its failure is read by whoever awaits it)."""
    waiter = asyncio.ensure_future(cell.wait())
    waiter.add_done_callback(lambda done: done.cancelled() or done.exception())
    return waiter


@dataclass
class WarmCell:
    """A ready cell and its attached bridge.

    Attributes:
        exited: The cell's exit code once it ends. Its waiter starts with the cell, so a
            leg that takes the cell asks the engine nothing more (SPEC §10.2 item 3).
    """

    bridge: CellBridge
    cell: Cell
    memory_limit_bytes: int
    ready_at: float = field(default_factory=time.monotonic)
    exited: asyncio.Future[int] | None = None

    async def destroy(self) -> None:
        """Removes the container and the socket directory."""
        with contextlib.suppress(Exception):
            await self.cell.remove()
        await self.bridge.close()


class WarmPool:
    """Keeps ``size`` cells of one memory limit ready.

    The pool sizes itself: it keeps at least ``size`` cells, and as many more
    as legs arrive while one cell starts (:meth:`target_size`), at most
    ``max_size`` (``CELLBLOCK_MAX_CONCURRENT_LEGS``), so a burst falls back to
    cold starts only until the pool catches up.

    Args:
        executor: Starts the cells.
        socket_base: Host directory for the cells' socket directories.
        size: Cells kept ready at least (0 disables the pool).
        memory_limit_bytes: The engine limit the pooled containers are sized
            for; legs with another limit start a fresh cell.
        max_size: Most cells kept ready (defaults to ``size``: fixed size).
    """

    def __init__(self, executor: Executor, socket_base: str, *, size: int, memory_limit_bytes: int, max_size: int | None = None) -> None:
        self._executor = executor
        self._socket_base = socket_base
        self.size = size
        self.max_size = max(size, max_size if max_size is not None else size)
        self._acquired_at: collections.deque[float] = collections.deque()
        #: Seconds a take defers the refill (:data:`REFILL_DEFER_S`; 0: none).
        self.refill_defer_s = REFILL_DEFER_S
        #: Refills wait until then while a cell is still ready.
        self._defer_until = 0.0
        #: Smoothed seconds from container start to attach (the refill time).
        self.start_s = 2.0
        self.memory_limit_bytes = memory_limit_bytes
        self._ready: list[WarmCell] = []
        self._starting = 0
        self._closed = False
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        #: Cells being started or destroyed in the background; close() waits for them.
        self._starters: set[asyncio.Task[None]] = set()
        self._owned: set[str] = set()
        #: Cells handed to legs, and legs that found the pool empty.
        self.hits = 0
        self.misses = 0

    def start(self) -> None:
        """Starts the background refill."""
        if self.size > 0 and self._task is None:
            self._task = asyncio.ensure_future(self._refill_forever())

    def acquire(self, memory_limit_bytes: int) -> WarmCell | None:
        """Takes a ready cell sized for ``memory_limit_bytes``, or ``None``."""
        if self._closed or memory_limit_bytes != self.memory_limit_bytes:
            return None
        now = time.monotonic()
        self._acquired_at.append(now)
        while self._ready:
            warm = self._ready.pop(0)
            if now - warm.ready_at < MAX_IDLE_S and not warm.bridge.inbox.qsize():
                self._owned.discard(warm.cell.cell_id)
                self.hits += 1
                # Deferred from the first take on, never extended: a run of takes waits refill_defer_s at most.
                self._defer_until = self._defer_until if self._defer_until > now else now + self.refill_defer_s
                self._wake.set()
                return warm
            asyncio.ensure_future(self._drop(warm))
        self.misses += 1
        self._defer_until = 0.0
        self._wake.set()
        return None

    @property
    def ready_count(self) -> int:
        """Cells ready to be taken now."""
        return len(self._ready)

    def target_size(self) -> int:
        """Cells to keep ready now, within ``size`` … ``max_size``.

        The larger of: the legs that arrived within the last refill time (a
        burst asks for as many cells as it had legs), and the legs expected
        during one refill at the rate of the last :data:`RATE_WINDOW_S`.
        """
        now = time.monotonic()
        while self._acquired_at and self._acquired_at[0] < now - RATE_WINDOW_S:
            self._acquired_at.popleft()
        refill_s = max(1.0, self.start_s)
        burst = sum(1 for t in self._acquired_at if t >= now - refill_s)
        steady = math.ceil(len(self._acquired_at) / RATE_WINDOW_S * refill_s)
        return max(self.size, min(self.max_size, max(burst, steady)))

    async def take(self, memory_limit_bytes: int, until: float = math.inf) -> WarmCell | None:
        """Like :meth:`acquire`, but only hands out a cell that still runs and is not paused.

        A dead or frozen cell (paused, stopped, its agent gone or hung: its bridge stream
        ended, which an unanswered ping over the bridge also does) is destroyed and the
        next one tried; ``None`` when none is left. Checking the cells one after another is
        bounded by ``until`` (``loop.time()``, the leg's cell wait): a cell the engine has
        not vouched for by then is destroyed too (fail closed) and ``None`` returned, so the
        caller sees its wait spent.

        Args:
            memory_limit_bytes: The leg's engine memory limit.
            until: When the leg's cell wait ends (``math.inf``: no bound but the engine's own).
        """
        loop = asyncio.get_running_loop()
        while loop.time() < until:
            warm = self.acquire(memory_limit_bytes)
            if warm is None:
                return None
            exited = warm.exited is not None and warm.exited.done()
            try:
                if warm.bridge.attached.is_set() and not exited and await still_serves(warm.cell, warm.bridge, until):
                    return warm
                log.warning("pool.cell_dead", cell_id=warm.cell.cell_id)
            except TimeoutError:
                log.warning("pool.cell_unknown", cell_id=warm.cell.cell_id)
            self.hits -= 1
            task = asyncio.ensure_future(warm.destroy())
            self._starters.add(task)  # close() waits for it
            task.add_done_callback(self._starters.discard)
        return None

    def idle_container_names(self) -> set[str]:
        """Containers the pool owns (starting or ready), not serving any leg."""
        return {f"cellblock-{cell_id}" for cell_id in self._owned}

    def idle_cell_ids(self) -> set[str]:
        """Cell ids the pool owns (starting or ready), not serving any leg."""
        return set(self._owned)

    async def _drop(self, warm: WarmCell) -> None:
        # Owned until its container is gone: a cell being destroyed is the pool's, not a leg's.
        try:
            await warm.destroy()
        finally:
            self._owned.discard(warm.cell.cell_id)

    async def _refill_forever(self) -> None:
        while not self._closed:
            now = time.monotonic()
            target = self.target_size()
            surplus = len(self._ready) - target
            retired = []
            for warm in list(self._ready):
                # Too old, or above the target for a whole rate window: retire.
                # Taken out of the list before any await, so acquire() never
                # hands over a cell that is being dropped (and vice versa).
                if now - warm.ready_at >= MAX_IDLE_S or (surplus > 0 and now - warm.ready_at >= RATE_WINDOW_S):
                    surplus -= 1
                    self._ready.remove(warm)
                    retired.append(warm)
            await asyncio.gather(*(self._drop(w) for w in retired), return_exceptions=True)
            deferred = self._defer_until - time.monotonic()
            if deferred > 0:
                # A leg just took a cell: start none yet (a leg that finds the pool empty wakes this).
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout=deferred)
                continue
            missing = min(self.target_size() - len(self._ready) - self._starting, MAX_STARTING - self._starting)
            for _ in range(max(0, missing)):
                self._starting += 1
                task = asyncio.ensure_future(self._start_one())
                self._starters.add(task)
                task.add_done_callback(self._starters.discard)
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=5.0)

    async def _start_one(self) -> None:
        warm: WarmCell | None = None
        began = time.monotonic()
        try:
            bridge = await self._executor.open_bridge(self._socket_base, pooled_bridge_message_bytes(self.memory_limit_bytes), ping=True)
            spec = CellSpec(cell_id="cell_" + secrets.token_hex(8), bridge_dir=bridge.directory, cell_token=bridge.token, memory_limit_bytes=self.memory_limit_bytes, ahead=True)
            self._owned.add(spec.cell_id)
            try:
                cell = await self._executor.start(spec)
            except BaseException:
                self._owned.discard(spec.cell_id)
                await bridge.close()
                raise
            warm = WarmCell(bridge, cell, self.memory_limit_bytes, exited=exit_waiter(cell))
            await asyncio.wait_for(bridge.attached.wait(), timeout=ATTACH_TIMEOUT_S)
            # Started at a low CPU weight (its start-up yields to the legs' cells); a leg's from now on.
            await cell.serve_ready()
            warm.ready_at = time.monotonic()
            self.start_s = 0.7 * self.start_s + 0.3 * (warm.ready_at - began)
            if self._closed:
                await self._drop(warm)
                return
            self._ready.append(warm)
        except (CellStartError, OSError, TimeoutError) as exc:
            # A TimeoutError (the cell did not attach in time) has no text of its own.
            reason = str(exc)[:200] or (f"the cell did not attach within {ATTACH_TIMEOUT_S} s" if isinstance(exc, TimeoutError) else "")
            log.error("pool.cell_failed", error_class=exc.__class__.__name__, reason=reason)
            if warm is not None:
                await self._drop(warm)
            await asyncio.sleep(1.0)  # back off; legs still start fresh cells
        finally:
            self._starting -= 1
            self._wake.set()

    async def close(self) -> None:
        """Stops refilling and destroys every ready or starting cell."""
        self._closed = True
        self._wake.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        # Cells still starting see the flag and destroy themselves.
        # Bounded: an engine that stops answering must not hold the service's shutdown.
        starters = list(self._starters)
        if starters:
            await asyncio.wait(starters, timeout=POOL_CLOSE_S)
        ready, self._ready = self._ready, []
        await asyncio.gather(*(self._drop(w) for w in ready), return_exceptions=True)
