"""The one settle loop of a leg: runtime events, timers, held-call dispatch and abandon.

A leg settles its run's bridge requests in two places: in the cell (the
:class:`~cellblock.server.runs._leg.Leg`) and, at the start of a wait, before any cell
exists (SPEC §10.6 item 3: a wait resumes only once it has something to deliver).
Both are this class: :meth:`SettleLoop.await_results` is the cell-free part and the leg
subclass adds the cell. They read one queue (the port's), so an event that arrives while
the wait has no cell is still there when the cell starts.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import structlog
from structlog.typing import FilteringBoundLogger

from cellblock.server import messages as msg
from cellblock.server.runs._policy import dispatch_request, dispatchable, record_tool_outcome
from cellblock.server.runs._ports import LegPorts
from cellblock.server.runs._protocol import (
    TIMER_FIRED,
    BridgeMethod,
    Cancelled,
    CellExited,
    ErrorCode,
    HostedSettled,
    LegEvent,
    LegOutcome,
    SlotReserved,
    TimerDue,
    ToolOutcome,
    failed,
    slot_refused,
)
from cellblock.server.runs._state import PendingRequest, Run
from cellblock.server.store import SlotAnswer

log = structlog.get_logger("cellblock.leg")


class SettleLoop:
    """Settles one run's requests during one leg.

    Args:
        run: The run (state persists across legs).
        ports: The leg's port; its queue carries every event of the leg.
        deadline: Absolute ``loop.time()`` of the leg's deadline.
        reserve_slot: Awaited before the run's first dispatch or suspension; false
            (a :class:`SlotAnswer` refusal) when the deployment has no slot free or the
            run's scope holds its share (SPEC §10.7).
        slot_cap: The deployment's suspended-run cap, quoted by [R01] and [R23].
    """

    def __init__(self, run: Run, ports: LegPorts, *, deadline: float, reserve_slot: Callable[[Run], Awaitable[SlotAnswer]], slot_cap: int) -> None:
        self.run_ = run
        self.ports = ports
        self.deadline = deadline
        self._reserve_slot = reserve_slot
        self.slot_cap = slot_cap
        #: Nested calls waiting for the run's first slot (the store answers asynchronously).
        self._awaiting_slot: list[PendingRequest] = []
        self._tasks: list[asyncio.Future[object]] = []
        self._log: FilteringBoundLogger = log.bind(run_id=run.run_id, session_id=run.session_id, agent_run_id=run.agent_run_id, tool_call_id=run.tool_call_id)

    # ------------------------------------------------------------ tasks
    def _spawn(self, coro: Coroutine[object, object, object]) -> asyncio.Future[object]:
        task: asyncio.Future[object] = asyncio.ensure_future(coro)
        self._tasks.append(task)
        return task

    def _cancel_tasks(self) -> None:
        for task in self._tasks:
            task.cancel()

    def arm_timer(self, p: PendingRequest) -> asyncio.Future[object]:
        """Puts :class:`TimerDue` on the queue when the timer ``p`` is due (its wall-clock ``due_at``)."""
        delay = max(0.0, p.due_at - time.time())

        async def fire() -> None:
            await asyncio.sleep(delay)
            await self.ports.events.put(TimerDue(p.bridge_id))

        return self._spawn(fire())

    def unsettled_timers(self) -> list[PendingRequest]:
        """Timers of the run that have not fired (they keep their due time across legs)."""
        return [p for p in self.run_.pending.values() if p.method is BridgeMethod.TIMER and p.result is None]

    async def hold_events_until(self, ready: asyncio.Future[object], timeout_s: float) -> CellExited | Cancelled | None:
        """Waits up to ``timeout_s`` for ``ready`` (the cell's attach), keeping other events for later.

        Events other than the cell's exit and a cancel stay on the queue, in arrival order and
        ahead of later ones, for the settle loop; ``timeout_s`` counts from the call.

        Returns:
            The :class:`CellExited` or :class:`Cancelled` that came before ``ready``, else ``None``.

        Raises:
            TimeoutError: ``ready`` was not done in time.
        """
        loop = asyncio.get_running_loop()
        give_up = loop.time() + timeout_s
        held: list[LegEvent] = []
        try:
            while not ready.done():
                get = asyncio.ensure_future(self.ports.events.get())
                waiting: set[asyncio.Future[Any]] = {ready, get}
                done, _ = await asyncio.wait(waiting, timeout=max(0.0, give_up - loop.time()), return_when=asyncio.FIRST_COMPLETED)
                if get not in done:
                    get.cancel()
                    if not done:
                        raise TimeoutError
                    continue
                event = get.result()
                if isinstance(event, CellExited | Cancelled):
                    return event
                held.append(event)
            return None
        finally:
            queue = self.ports.events
            later = [queue.get_nowait() for _ in range(queue.qsize())]
            for event in [*held, *later]:
                queue.put_nowait(event)

    async def unless_aborted(self, work: Coroutine[object, object, None], bound_s: float) -> LegOutcome | None:
        """Runs ``work`` (a long request's reading in a worker) unless a cancel or the cell's exit comes first.

        The reading may take up to :data:`~cellblock.server.limits.LARGE_JSON_BUDGET_MS`
        (queueing for a worker included); a ``Cancel``, ``CancelRun`` or the cell's death
        meanwhile ends the leg now (SPEC §3.6 item 1), not after it: ``work`` is cancelled,
        and with it its worker call (the pool drops a queued call and stops the worker
        running one). Other events stay queued, in order, for the settle loop.

        Args:
            work: The coroutine; what it raises is raised here.
            bound_s: Longest ``work`` can take by its own budgets; past it the loop only awaits it.

        Returns:
            The aborted outcome when a cancel came first, else ``None`` (a cell exit that came
            first is queued again for the settle loop).
        """
        task: asyncio.Future[object] = asyncio.ensure_future(work)
        try:
            first = await self.hold_events_until(task, bound_s)
        except TimeoutError:
            first = None
        if first is None:
            await task
            return None
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        if isinstance(first, Cancelled):
            return self.on_runtime_event(first, asyncio.get_running_loop().time())
        self.ports.events.put_nowait(first)
        return None

    # ------------------------------------------------------------ dispatch and abandon
    def dispatch(self, p: PendingRequest) -> None:
        """Dispatches one resolved nested call, or holds it until the run's slot is reserved.

        The first call of a run without a slot asks the run store for one; the answer
        comes back on the queue as :class:`SlotReserved` (the settle loop keeps running).
        Calls go out in request order: while earlier calls wait for that answer, a later
        one queues behind them even when the run already holds its slot (the store's
        answer sets ``holds_slot`` before :class:`SlotReserved` reaches the loop).
        """
        if self.run_.holds_slot and not self._awaiting_slot:
            dispatch_request(self.run_, self.ports, p)
            return
        self._awaiting_slot.append(p)
        if len(self._awaiting_slot) == 1:

            async def take_slot() -> None:
                await self.ports.events.put(SlotReserved(await self._reserve_slot(self.run_)))

            self._spawn(take_slot())

    def reserve_slot_now(self) -> None:
        """Asks the store for the run's slot now unless it holds one; awaiting ``reserve_slot`` later gets the same answer."""
        if self.run_.holds_slot:
            return
        run = self.run_

        async def reserve() -> None:
            await self._reserve_slot(run)

        self._spawn(reserve())

    def redispatch(self, p: PendingRequest) -> None:
        """Dispatches a call that waited for the run's slot (the leg rechecks its deadline)."""
        self.dispatch(p)

    async def dispatch_held(self) -> LegOutcome | None:
        """Dispatches what a yield, the deadline or restart safety held back (SPEC §10.6 item 3).

        Returns:
            The [R01] or [R23] failure when the run could not get a suspended-run slot, else ``None``.
        """
        held = [p for p in self.run_.pending.values() if dispatchable(p)]
        if held and not self.run_.holds_slot:
            answer = await self._reserve_slot(self.run_)
            if not answer:
                return slot_refused(answer, self.slot_cap)
        for p in held:
            dispatch_request(self.run_, self.ports, p)
        return None

    def abandon_dispatched(self) -> None:
        """Tells the runtime about every dispatched call that has no result (SPEC §3.6)."""
        for p in self.run_.pending.values():
            if p.dispatched and p.nested_call_id and p.result is None:
                self._log.info("tool_call.abandoned", bridge_id=p.bridge_id, nested_call_id=p.nested_call_id)
                self.ports.cancel_notice(p.nested_call_id)

    # ------------------------------------------------------------ runtime events
    def on_settled(self, p: PendingRequest) -> None:
        """Called when ``p`` has a settlement; the leg delivers it, a cell-free wait keeps it."""

    def on_runtime_event(self, event: LegEvent, now: float) -> LegOutcome | None:
        """Handles the events that need no cell: cancel, tool results, timers, hosted settlements.

        Returns:
            The aborted outcome on :class:`Cancelled`, the [R01]/[R23] failure on a refused
            :class:`SlotReserved`, else ``None``.
        """
        match event:
            case Cancelled(reason=reason):
                self.abandon_dispatched()
                return failed(ErrorCode.ABORTED, msg.aborted(reason))
            case ToolOutcome():
                settled = record_tool_outcome(self.run_, event, now)
                if settled is not None:
                    self.on_settled(settled)
            case TimerDue(bridge_id=bridge_id):
                timer = self.run_.pending.get(bridge_id)
                if timer is not None and timer.result is None:
                    timer.result = TIMER_FIRED
                    timer.settled_at = now
                    self.on_settled(timer)
            case SlotReserved(granted=granted):
                held, self._awaiting_slot = self._awaiting_slot, []
                if not granted:
                    self.abandon_dispatched()
                    return slot_refused(granted, self.slot_cap)
                for p in held:
                    self.redispatch(p)
            case HostedSettled(bridge_id=bridge_id):
                # A cellblock-hosted MCP call already recorded its result on the run.
                hosted = self.run_.pending.get(bridge_id)
                if hosted is not None and hosted.result is not None:
                    self.on_settled(hosted)
        return None

    # ------------------------------------------------------------ the cell-free part of a wait
    def ready_to_resume(self) -> bool:
        """Whether the wait has something to deliver.

        An ordinary run resumes once one result is available; a restart-safe run once all of
        its requests have one (it resumes once per leg, SPEC §10.8 item 2).
        """
        settled = [p.result is not None for p in self.run_.pending.values()]
        return all(settled) if self.run_.restart_safe else any(settled)

    async def await_results(self) -> LegOutcome | None:
        """Waits, without a cell, until the wait has something to deliver (SPEC §10.6 item 3).

        Gives up ``min_resume_budget_ms`` before the deadline. Timers armed here are
        cancelled on return (the leg arms its own).

        Returns:
            The aborted outcome when the leg was cancelled, else ``None``.
        """
        loop = asyncio.get_running_loop()
        budget_s = self.run_.limits.min_resume_budget_ms / 1000.0
        timers = [self.arm_timer(p) for p in self.unsettled_timers()]
        try:
            while not self.ready_to_resume():
                remaining = self.deadline - loop.time() - budget_s
                if remaining <= 0:
                    return None
                try:
                    event = await asyncio.wait_for(self.ports.events.get(), timeout=remaining)
                except TimeoutError:
                    return None
                outcome = self.on_runtime_event(event, loop.time())
                if outcome is not None:
                    return outcome
            return None
        finally:
            for task in timers:
                task.cancel()
            self._tasks = [t for t in self._tasks if t not in timers]

