"""One leg of a run in a cell: start it, attach it, drive its settle loop (SPEC §10.2-10.4).

A leg owns exactly one cell. It starts it (or takes a warm or, under cell reuse, its scope's kept cell), feeds it
the program (or the snapshot), answers its bridge requests, forwards nested calls to the runtime, enforces the
deadline with the host watchdog, and ends with one result. Every path out of :meth:`Leg.run` destroys the cell and
removes its socket directory, unless cell reuse keeps it for the scope's next leg (SPEC §16.2,
:mod:`~cellblock.server.runs._reuse_rule`). Request policy is :mod:`~cellblock.server.runs._policy` (long arguments
:mod:`~cellblock.server.runs._long_request`), the shared settle-loop parts :mod:`~cellblock.server.runs._settle`, the
mapping of a guest's failure :mod:`~cellblock.server.runs._guest_failure`, the wait for a cell :mod:`~cellblock.server.runs._cell_wait`.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from cellblock.bridge.v1 import bridge_service_pb2 as bpb
from cellblock.server import messages as msg
from cellblock.server.catalog import strict_json
from cellblock.server.cells import Cell, CellBridge, Executor, ScopeCell, ScopeCells, WarmPool
from cellblock.server.limits import DEFAULT_CELL_WAIT_MS, MAX_BRIDGE_ID_CHARS, MAX_VALUE_DEPTH, WATCHDOG_GRACE_MS
from cellblock.server.runs._cell_wait import await_attach, fresh_cell, wait_exceeded
from cellblock.server.runs._guest_failure import exit_failure
from cellblock.server.runs._leg_end import LegEnding
from cellblock.server.runs._long_request import LONG_REQUEST_BOUND_S, admit_long_request, is_long_request
from cellblock.server.runs._output import NotSerializableError, is_output_entry
from cellblock.server.runs._policy import Next, admit_request, dispatchable, process_request, refuse_over_host_limits, reply_inbox_bytes, restart_safe_label
from cellblock.server.runs._ports import LegPorts
from cellblock.server.runs._protocol import BridgeMethod, CellExited, DeadlineTick, ErrorCode, GuestMessage, LegOutcome, ProtocolViolation, failed
from cellblock.server.runs._snapshot_in import SnapshotIn
from cellblock.server.runs._start import start_message_off_loop
from cellblock.server.runs._state import PendingRequest, Run
from cellblock.server.store import SlotAnswer
from cellblock.server.telemetry import LegTrace
from cellblock.server.workers import CpuPool, cpu_pool

#: Snapshot bytes per bridge message, both directions.
_CHUNK = bpb.BRIDGE_LIMIT_SNAPSHOT_CHUNK_BYTES


class Leg(LegEnding):
    """Runs one leg of ``run`` in a fresh cell.

    Args:
        run: The run (state persists across legs).
        executor: Starts the cell.
        ports: The leg's one port (its runtime stream and event queue).
        deadline: Absolute ``loop.time()`` of the leg's deadline.
        socket_base: Host directory for per-cell bridge socket directories.
        source: The prepared program for an exec leg; ``None`` when resuming.
        reserve_slot: Awaited before the run's first dispatch or suspension; a false
            :class:`SlotAnswer` when the cap or the scope's share is reached (SPEC §10.7).
        slot_cap: The deployment's suspended-run cap, quoted by [R01] and [R23].
        snapshot: The run's stored snapshot when resuming (``None`` for exec).
        pool: Warm cells, if the deployment keeps any.
        cell_wait_s: Bound on waiting for a cell (taking, starting, attaching it), outside the program's budget ([R21]).
        scope_cells: Cells kept for their scope's next leg (``CELLBLOCK_CELL_REUSE=scope``), else ``None``.
        cpu: Worker processes for long JSON arguments (default: the process-wide pool).
    """

    def __init__(
        self,
        run: Run,
        executor: Executor,
        ports: LegPorts,
        *,
        deadline: float,
        socket_base: str,
        source: str | None,
        reserve_slot: Callable[[Run], Awaitable[SlotAnswer]],
        slot_cap: int,
        snapshot: bytes | None = None,
        pool: WarmPool | None = None,
        cell_wait_s: float = DEFAULT_CELL_WAIT_MS / 1000,
        scope_cells: ScopeCells | None = None,
        cpu: CpuPool | None = None,
    ) -> None:
        super().__init__(run, ports, deadline=deadline, reserve_slot=reserve_slot, slot_cap=slot_cap)
        self.cpu = cpu or cpu_pool()
        self.executor, self.socket_base, self.source = executor, socket_base, source
        self._snapshot = snapshot
        self.pool = pool
        self.cell_wait_s = cell_wait_s
        #: When waiting for a cell (start and attach) gives up ([R21]); set when the leg starts.
        self._cell_wait_until = 0.0
        self.scope_cells = scope_cells
        self._bridge: CellBridge | None = None
        self._cell: Cell | None = None
        self._kept: ScopeCell | None = None
        self._exited: asyncio.Future[int] | None = None  # a pooled cell's exit waiter (started with it)
        #: The guest's end was clean and accepted; nothing put the cell in doubt (SPEC §16.2 item 2).
        self._clean_end = False
        self._in_doubt = False
        self._outcome: LegOutcome | None = None
        self._suspend_sent = False
        self._out_of_memory = False  # the engine's verdict on an exit 137
        #: True once the cell has its Start message; settlements before that are delivered with it.
        self._started = False
        self._terminal: LegOutcome | None = None
        self._snapshot_in = SnapshotIn(run.limits.max_snapshot_bytes)
        #: Controller refusals of this leg by (method, refusal kind): how many.
        self._refusals_logged: dict[tuple[str, str], int] = {}
        #: Output entries accepted in this leg, in production order.
        self.accepted_output: list[dict[str, Any]] = []
        #: The leg's spans (``cell.run``, ``cell.acquire``, ``snapshot.*``).
        self.trace = LegTrace(run, executor)

    # ------------------------------------------------------------------ run
    async def run(self) -> LegOutcome:
        """Runs the leg to its end inside a ``cell.run`` span. Never raises for guest or cell failures."""
        with self.trace.running():
            outcome = await self._run_cell()
            if sum(self._refusals_logged.values()) > len(self._refusals_logged):
                counts = {f"{method}:{kind}": n for (method, kind), n in self._refusals_logged.items()}
                self._log.warning("bridge.refused_by_guest_total", refusals=counts)
            self.trace.finish(outcome.status, outcome.code or "")
            return outcome

    async def _run_cell(self) -> LegOutcome:
        loop = asyncio.get_running_loop()
        run = self.run_
        run.legs += 1
        # Waiting for a cell has its own bound, outside the program's budget (SPEC §10.2 item 3).
        until = self._cell_wait_until = loop.time() + self.cell_wait_s
        # The scope's kept cell (cell reuse), else a warm cell (started and attached ahead
        # of time, still alive) of this size, else a fresh cell; all within the cell wait.
        scope = (run.session_id, run.agent_run_id)
        self._kept = await self.scope_cells.take(scope, run.limits.memory_limit_bytes, run.limits.bridge_message_bytes, until) if self.scope_cells is not None else None
        warm = await self.pool.take(run.limits.memory_limit_bytes, until) if self.pool is not None and self._kept is None else None
        ready = self._kept or warm
        cell_id = ready.cell.cell_id if ready is not None else "cell_" + secrets.token_hex(8)
        self._log = self._log.bind(cell_id=cell_id)
        structlog.contextvars.bind_contextvars(cell_id=cell_id)
        self.trace.acquiring(cell_id)
        try:
            reused = self._kept is not None
            if ready is not None:
                self._bridge, self._cell = ready.bridge, ready.cell
                self._exited = warm.exited if warm is not None else None
            elif loop.time() >= until:  # checking pooled or kept cells spent the wait: no cold start that cannot finish
                return wait_exceeded(self._log, "take", self.cell_wait_s)  # no cell started: no cell id
            else:
                fresh = await fresh_cell(self.executor, self.socket_base, cell_id, run.limits, until, self.cell_wait_s, self._log)
                if isinstance(fresh, LegOutcome):
                    fresh.cell_id = cell_id
                    return fresh
                self._bridge, self._cell = fresh
            if self._kept is None and self.scope_cells is not None:
                self._kept = self.scope_cells.begin(scope, self._cell, self._bridge, run.limits.memory_limit_bytes, self._exited)
            self._log.debug("cell.started", runtime_id=self._cell.runtime_id, reused=reused, warm=warm is not None)
            self.trace.started(self._cell.runtime_id)
            outcome = self._outcome = await self._attach_and_drive(loop)
            outcome.cell_id = cell_id
            return outcome
        finally:
            self._cancel_tasks()
            self.release_cell()

    def _deliver_guest(self, item: bpb.AttachRequest | None) -> None:
        self.ports.events.put_nowait(GuestMessage(item))

    async def _attach_and_drive(self, loop: asyncio.AbstractEventLoop) -> LegOutcome:
        assert self._bridge is not None and self._cell is not None
        run = self.run_
        self._spawn(self._watch_cell())
        not_attached = await await_attach(self, self._cell, self._spawn(self._bridge.attached.wait()), self._cell_wait_until, self.cell_wait_s, self._log)
        if not_attached is not None:
            return not_attached
        self.trace.attached()
        # The program's budget starts now that a cell is ready for it (SPEC §10.2 item 3).
        self.deadline += loop.time() - (self._cell_wait_until - self.cell_wait_s)
        snapshot = self._snapshot if self.source is None else None
        if self.source is None and snapshot is None:
            return failed(ErrorCode.RUNTIME_UNAVAILABLE, msg.r18("its snapshot is no longer stored"))
        if snapshot is not None and run.engine_build_id and self._bridge.engine_build_id != run.engine_build_id:
            return failed(ErrorCode.RUNTIME_UNAVAILABLE, msg.R19)
        run.engine_build_id = self._bridge.engine_build_id
        # Guest messages go onto the leg's event queue as the bridge reads them.
        self._bridge.deliver_to(self._deliver_guest)
        await self._send_start(loop, snapshot)
        self._started = True
        # Deliver what settled while the run was suspended, in completion order.
        for p in sorted((p for p in run.pending.values() if p.result is not None), key=lambda p: p.settled_at):
            self._deliver(p)
        if not run.restart_safe:
            self._dispatch_undispatched()
            for p in self.unsettled_timers():
                self.arm_timer(p)
        return await self._settle_loop(loop)

    async def _send_start(self, loop: asyncio.AbstractEventLoop, snapshot: bytes | None) -> None:
        assert self._bridge is not None
        run = self.run_
        remaining_ms = max(1, int((self.deadline - loop.time()) * 1000))
        start = bpb.Start(
            run_id=run.run_id,
            source=self.source or "",
            limits=bpb.LegLimits(
                deadline_ms=remaining_ms,
                memory_limit_bytes=run.limits.memory_limit_bytes,
                max_pending_tool_calls=run.limits.max_pending_tool_calls,
                reply_inbox_bytes=reply_inbox_bytes(run),
                max_output_bytes=run.limits.max_output_bytes,
                output_spent_bytes=run.budget.spent,
                output_closed=run.budget.closed,
            ),
            bridge_counters=run.bridge_counters,
            snapshot_bytes=len(snapshot) if snapshot is not None else 0,
            # Only a restart-safe run's leg decides on the guest's idles (_on_idle).
            idle_unneeded=not run.restart_safe,
        )
        # The catalog's megabytes were serialized once per catalog version, off the loop.
        self._bridge.send(await start_message_off_loop(run.view.start_catalog_part(), start))
        if snapshot is not None:
            self.trace.restoring(len(snapshot))
            for i in range(0, len(snapshot), _CHUNK):
                self._bridge.send(bpb.AttachResponse(snapshot_chunk=bpb.SnapshotChunk(data=snapshot[i : i + _CHUNK], last=i + _CHUNK >= len(snapshot))))

    # ---------------------------------------------------------- settle loop
    async def _settle_loop(self, loop: asyncio.AbstractEventLoop) -> LegOutcome:
        # Woken at the deadline and the kill time by two timers armed once, not a timeout per event.
        kill_at = self.deadline + WATCHDOG_GRACE_MS / 1000
        ticks = [loop.call_at(when, self.ports.events.put_nowait, DeadlineTick()) for when in (self.deadline, kill_at)]
        try:
            return await self._settle_events(loop, kill_at)
        finally:
            for tick in ticks:
                tick.cancel()

    async def _settle_events(self, loop: asyncio.AbstractEventLoop, kill_at: float) -> LegOutcome:
        run = self.run_
        events = self.ports.events
        while True:
            if loop.time() >= self.deadline and not self._suspend_sent and run.pending:
                # Waiting for host work at the deadline is not a timeout: park.
                self._suspend()
            event = events.get_nowait() if not events.empty() else await events.get()  # no task per event
            if isinstance(event, DeadlineTick):
                if loop.time() >= kill_at:
                    assert self._cell is not None
                    await self._cell.kill()
                    self._log.warning("cell.killed_by_watchdog")
                    self.abandon_dispatched()
                    return failed(ErrorCode.TIMEOUT, msg.r06(run.limits.timeout_ms))
                continue
            match event:
                case CellExited(code=code):
                    # A clean `end` is always queued before the exit can be seen
                    # unless the cell died; drain what is already queued first.
                    outcome = self._drain_after_exit(code, loop)
                case GuestMessage(message=message):
                    ending = self._on_guest(message)
                    if self._terminal is not None:
                        self.abandon_dispatched()
                        return self._terminal
                    outcome = await ending if ending is not None else None
                case _:
                    outcome = self.on_runtime_event(event, loop.time())
            if outcome is not None:
                return outcome

    def _on_guest(self, message: bpb.AttachRequest | None) -> Awaitable[LegOutcome | None] | None:
        self.trace.guest_spoke()
        if message is None:
            # The stream ended; the exit watcher reports how.
            return None
        which = message.WhichOneof("message")
        if which == "request":
            return self._on_request(message.request)
        if which == "output":
            self._on_output(message.output.entry_json)
        elif which == "omission":
            self._on_omission(message.omission)
        elif which == "idle":
            self._on_idle(message.idle.host_work)
        elif which == "snapshot_chunk" and self._suspend_sent:
            self._snapshot_in.add(message.snapshot_chunk.data)  # kept only up to maxSnapshotBytes
        elif which == "end":
            return self._on_end(message.end)
        else:
            self._log.error("bridge.invalid_message", kind=which)
            self._terminal = failed(ErrorCode.INTERNAL_ERROR, msg.R17)
        return None

    def _drain_after_exit(self, code: int, loop: asyncio.AbstractEventLoop) -> LegOutcome | None:
        run = self.run_
        if code == bpb.CELL_EXIT_CODE_WATCHDOG or (loop.time() >= self.deadline and not self._suspend_sent):
            self.abandon_dispatched()
            self._log.warning("cell.stopped_at_deadline", exit_code=code)
            return failed(ErrorCode.TIMEOUT, msg.r05(run.limits.timeout_ms))
        # Let any queued guest messages (including `end`) be processed first.
        if not self.ports.events.empty():
            self.ports.events.put_nowait(CellExited(code))
            return None
        self.abandon_dispatched()
        bound = self._bridge.max_message_bytes if self._bridge is not None else 0
        return exit_failure(run, code, self._log, out_of_memory=self._out_of_memory, bridge_bound=bound)

    def _suspend(self) -> None:
        assert self._bridge is not None
        self._suspend_sent = True
        self.trace.suspend_requested()
        self._bridge.send(bpb.AttachResponse(suspend=bpb.Suspend()))

    # ---------------------------------------------------------- requests
    def _on_request(self, req: bpb.GuestRequest) -> Awaitable[LegOutcome | None] | None:
        if is_long_request(req):
            return self._on_long_request(req)  # read in a worker, the leg's other events wait (SPEC §3.1 item 6)
        p = admit_request(self.run_, req, self._log, self._refusals_logged)
        if not isinstance(p, PendingRequest):
            if p is not None:
                self._refuse_protocol(p)
            return None
        loop = asyncio.get_running_loop()
        if refuse_over_host_limits(self.run_, p, loop.time()):
            self._in_doubt = True  # the controller's own layer let it through
            self.on_settled(p)  # the host's second layer answered it (B23/B24)
        else:
            self._next_step(p, process_request(self.run_, p, loop.time()), loop)
        return None

    async def _on_long_request(self, req: bpb.GuestRequest) -> LegOutcome | None:
        loop = asyncio.get_running_loop()

        async def admit() -> None:
            done = await admit_long_request(self.run_, req, self.cpu, self.deadline - loop.time(), self._log, self._refusals_logged, loop.time)
            self._in_doubt |= done.in_doubt
            if isinstance(done.request, ProtocolViolation):
                self._refuse_protocol(done.request)
            elif done.request is not None:
                self._next_step(done.request, done.step, loop) if done.step is not None else self.on_settled(done.request)

        return await self.unless_aborted(admit(), LONG_REQUEST_BOUND_S)  # a cancel meanwhile ends the leg now

    def _next_step(self, p: PendingRequest, step: Next, loop: asyncio.AbstractEventLoop) -> None:
        if self.run_.restart_safe:
            return  # held until the guest is idle (SPEC §10.8 item 2)
        match step:
            case Next.SETTLED:
                self.on_settled(p)
            case Next.TIMER:
                self.arm_timer(p)
            case Next.YIELD:
                # A yield parks the leg at once (SPEC §10.4 item 1).
                if not self._suspend_sent:
                    self._suspend()
            case Next.NESTED:
                self._dispatch(p, loop)

    def _refuse_protocol(self, violation: ProtocolViolation) -> None:
        """Rejects a protocol violation ([P01]-[P03]) back to the guest now, not at the watchdog (SPEC §14.5)."""
        assert self._bridge is not None
        self._in_doubt = True  # a bridge protocol break: the cell is never reused (SPEC §16.2)
        settle = bpb.Settle(bridge_id=violation.bridge_id[:MAX_BRIDGE_ID_CHARS], error=bpb.BridgeError(message=violation.message))
        self._bridge.send(bpb.AttachResponse(settle=settle))

    def _on_idle(self, host_work: int) -> None:
        """The guest waits on host work; a restart-safe leg decides now (SPEC §10.8 item 2).

        An idle is current only when the guest waits on exactly the requests the host
        has not answered yet. One sent before the guest read results already on their
        way (a resumed leg's first idle) is stale: the guest may still make requests.
        """
        run = self.run_
        if not run.restart_safe or self._suspend_sent or self._terminal is not None:
            return
        if host_work != len(run.pending):
            return
        unsafe = [p for p in run.pending.values() if p.result is None and not p.dispatched and not p.replay_safe]
        if unsafe:
            if all(p.method is BridgeMethod.NAMESPACE for p in unsafe):
                self._terminal = failed(ErrorCode.INVALID_INPUT, msg.R02)
            else:
                self._terminal = failed(ErrorCode.INVALID_INPUT, msg.r03(restart_safe_label(unsafe[0])))
            return
        self._suspend()

    def _dispatch_undispatched(self) -> None:
        loop = asyncio.get_running_loop()
        for p in list(self.run_.pending.values()):
            if dispatchable(p):
                self._dispatch(p, loop)

    def _dispatch(self, p: PendingRequest, loop: asyncio.AbstractEventLoop) -> None:
        if loop.time() >= self.deadline or self._suspend_sent:
            return  # held for the next wait (SPEC §10.9 item 3)
        self.dispatch(p)

    def redispatch(self, p: PendingRequest) -> None:
        """Dispatches a call that waited for the run's slot, unless the leg is parking now."""
        self._dispatch(p, asyncio.get_running_loop())

    def on_settled(self, p: PendingRequest) -> None:
        """Delivers a settlement now, when the cell can take it.

        Kept for later when the cell has not started yet (the cell-free part of a wait keeps it
        for the start), the leg is parking, or it is too close to its deadline.
        """
        if not self._started or self._suspend_sent:
            return
        if self.deadline - asyncio.get_running_loop().time() < self.run_.limits.min_resume_budget_ms / 1000.0:
            return  # kept for the next wait
        self._deliver(p)

    def _deliver(self, p: PendingRequest) -> None:
        assert self._bridge is not None and p.result is not None
        result = p.result
        self.run_.pending.pop(p.bridge_id, None)
        # A reply text is always encodable (SPEC §0.3 item 7), even one a schema or check library wrote.
        error = None if result.ok else bpb.BridgeError(message=msg.escape_lone_surrogates(result.payload), code=result.code)
        response = bpb.AttachResponse(settle=bpb.Settle(bridge_id=p.bridge_id, error=error))
        if result.ok:  # written in place: a Settle built apart is copied again into its response (60 MB: 50 ms on the loop)
            response.settle.ok_json = result.payload
        self._bridge.send(response)

    # ---------------------------------------------------------- output/end
    def _on_output(self, entry_json: str) -> None:
        try:
            entry = strict_json(entry_json, MAX_VALUE_DEPTH + 1)  # the entry object holds the value
        except RecursionError:
            self._log.warning("bridge.output_too_deep")  # SPEC §8.4 item 6: dropped and logged
            return
        except ValueError:
            entry = None
        if not is_output_entry(entry):  # not JSON, or not a text/json entry
            self._log.error("bridge.invalid_output")
            return
        try:
            accepted = self.run_.budget.offer(entry)
        except NotSerializableError:
            self._log.warning("bridge.output_too_deep")
            return
        if accepted:
            self.accepted_output.append(entry)
            self.ports.output(entry)

    def _on_omission(self, omission: bpb.OutputOmission) -> None:
        """Records entries the cell's controller omitted (SPEC §9 rule 11), as they are reported."""
        try:
            first = json.loads(omission.first_omitted_content or '""')
        except (ValueError, RecursionError):
            first = ""
        self.run_.budget.record_omitted(max(0, omission.omitted_entries), max(0, omission.omitted_bytes), first if isinstance(first, str) else "")
