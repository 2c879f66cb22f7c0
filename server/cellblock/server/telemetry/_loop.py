"""How long the shared event loop is held at a time (SPEC §2.3 "loop hold", issue 11 item 1).

Every RPC of every scope runs on one asyncio loop, so one callback that computes for
100 ms delays every tenant by 100 ms. :class:`LoopMonitor` is a task that sleeps
:data:`~cellblock.server.limits.LOOP_TICK_MS` at a time and measures how late it wakes.

A late wake-up has two causes: callbacks that computed on the loop, or an operating
system that did not schedule the process (a loaded machine). Only the first is the
service's fault, so a *hold* is the lateness capped by the CPU time the loop's thread
used meanwhile: ``min(lateness, loop thread CPU delta)``. Starved, the thread uses
little CPU and the hold stays small; computing, it uses CPU for the whole lateness. This
makes the number usable on a loaded 2-core test machine, where wall-clock lateness alone
is inflated by an order of magnitude. Another thread holding the GIL is not counted (its
CPU is not the loop thread's): CPU-heavy steps therefore go to worker *processes*
(:mod:`cellblock.server.workers`), never to threads.

The same lateness capped by the CPU time of the whole process instead is kept too
(``worst_process_s``, for tests and diagnostics): a thread that holds Python's lock in one
C call (the worker pool's threads unpickling a worker's result) stops the loop, and only
this measure counts it; it also counts the CPU other threads spend without the lock
meanwhile (gRPC's own threads), so it is an upper bound.

Holds of at least :data:`~cellblock.server.limits.LOOP_HOLD_RECORD_MS` are recorded in
the ``cellblock.loop.hold`` histogram (seconds); the worst since the last
:meth:`LoopMonitor.reset` is kept for tests and diagnostics.
"""

from __future__ import annotations

import asyncio
import time

import structlog
from opentelemetry import metrics

from cellblock.server.limits import LOOP_HOLD_LOG_MS, LOOP_HOLD_RECORD_MS, LOOP_TICK_MS

log = structlog.get_logger("cellblock.loop")

_hold = metrics.get_meter("cellblock.server").create_histogram(
    "cellblock.loop.hold", unit="s", description="Times the event loop was held by one step (lateness capped by the loop thread's CPU time)."
)


class LoopMonitor:
    """Measures the event loop's holds while it runs (see the module docstring).

    Attributes:
        worst_s: Longest hold since the last :meth:`reset`, in seconds.
        worst_lateness_s: Longest wall-clock lateness since the last reset (load included), in seconds.
        worst_process_s: Longest lateness capped by the whole process's CPU time since the last reset, in seconds.
        ticks: Wake-ups since the last reset.
    """

    def __init__(self, tick_ms: float = LOOP_TICK_MS) -> None:
        """Creates a stopped monitor; :meth:`start` runs it on the current loop."""
        self._tick_s = tick_ms / 1000.0
        self._task: asyncio.Task[None] | None = None
        self.worst_s = 0.0
        self.worst_lateness_s = 0.0
        self.worst_process_s = 0.0
        self.ticks = 0

    def start(self) -> None:
        """Starts measuring on the running loop (idempotent)."""
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._run())

    def stop(self) -> None:
        """Stops measuring."""
        if self._task is not None:
            self._task.cancel()
            self._task = None

    def reset(self) -> None:
        """Forgets the worst hold seen so far."""
        self.worst_s = 0.0
        self.worst_lateness_s = 0.0
        self.worst_process_s = 0.0
        self.ticks = 0

    async def _run(self) -> None:
        while True:
            wall, cpu, process = time.perf_counter(), time.thread_time(), time.process_time()
            await asyncio.sleep(self._tick_s)
            lateness = max(0.0, time.perf_counter() - wall - self._tick_s)
            hold = min(lateness, time.thread_time() - cpu)
            self.worst_process_s = max(self.worst_process_s, min(lateness, time.process_time() - process))
            self.ticks += 1
            self.worst_lateness_s = max(self.worst_lateness_s, lateness)
            if hold > self.worst_s:
                self.worst_s = hold
            if hold * 1000.0 >= LOOP_HOLD_RECORD_MS:
                _hold.record(hold)
                if hold * 1000.0 >= LOOP_HOLD_LOG_MS:
                    log.warning("loop.held", hold_ms=round(hold * 1000.0), lateness_ms=round(lateness * 1000.0))
