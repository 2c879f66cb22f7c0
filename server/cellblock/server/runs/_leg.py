"""One leg of a run: a cell, its bridge, and the settle loop (SPEC §10.2–10.4).

A leg owns exactly one cell. It starts it, feeds it the program (or the
snapshot), answers its bridge requests, forwards nested calls to the runtime,
enforces the deadline with the host watchdog, and ends with one result. Every
path out of :meth:`Leg.run` destroys the cell and removes its socket
directory.
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import structlog

from cellblock.bridge.v1 import bridge_service_pb2 as bpb
from cellblock.server import messages as msg
from cellblock.server.cells import Cell, CellBridge, CellSpec, CellStartError, Executor, WarmPool
from cellblock.server.limits import ATTACH_TIMEOUT_S, WATCHDOG_GRACE_MS
from cellblock.server.logging import error_head
from cellblock.server.runs._output import NotSerializableError, compact_json
from cellblock.server.runs._ports import BridgeReplyError, LegPorts, ToolOutcome
from cellblock.server.runs._state import PendingRequest, Run
from cellblock.server.store import SnapshotStore
from cellblock.server.telemetry import LegTrace, end_tool_call, record_bridge_call, start_tool_call

log = structlog.get_logger("cellblock.leg")

_BRIDGE_ID = re.compile(r"^bridge:([A-Za-z]+):([1-9][0-9]{0,15})$")
_METHODS = {"search", "describe", "call", "callValue", "namespace", "yield", "timer"}
_NESTED = {"call", "callValue", "namespace"}
_CHUNK = bpb.BRIDGE_LIMIT_SNAPSHOT_CHUNK_BYTES


#: Failure kinds whose message is guest text sent as a JSON string literal.
_GUEST_TEXT_KINDS = frozenset({bpb.FAILURE_KIND_GUEST_ERROR, bpb.FAILURE_KIND_BRIDGE_REJECTION, bpb.FAILURE_KIND_SYNTAX, bpb.FAILURE_KIND_MEMORY})


def _guest_text(literal: str) -> str:
    """Decodes guest text sent as a JSON string literal; malformed text is kept raw."""
    try:
        value = json.loads(literal)
    except ValueError:
        return literal
    return value if isinstance(value, str) else literal


def min_resume_budget_s(timeout_ms: int) -> float:
    """SPEC §2.3: ``min(250, max(1, floor(timeoutMs / 2)))`` ms, in seconds."""
    return min(250, max(1, timeout_ms // 2)) / 1000.0


@dataclass
class LegOutcome:
    """How a leg ended, before projection into a result object.

    Attributes:
        status: ``completed``, ``waiting`` or ``failed``.
        value: The JSON-safe value (completed).
        code, message, phase: The failure (failed).
        cell_id: The cell that ran the leg, if one started.
    """

    status: str
    value: Any = None
    code: str = ""
    message: str = ""
    phase: str = ""
    cell_id: str = ""
    reason: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def failed(code: str, message: str, phase: str = "host", cell_id: str = "") -> LegOutcome:
    """Builds a failed outcome."""
    return LegOutcome(status="failed", code=code, message=message, phase=phase, cell_id=cell_id)


def reject(run: Run, p: PendingRequest, message: str, provenance: str, code: str, now: float) -> None:
    """Settles a request with a host rejection and records its provenance (SPEC §8.2 item 6)."""
    p.result = (False, message, code)
    p.settled_at = now
    run.provenance[p.bridge_id] = provenance
    log.warning("bridge.rejected", run_id=run.run_id, bridge_id=p.bridge_id, nested_call_id=p.nested_call_id or None, provenance=provenance, reason=message[:200])


def record_tool_outcome(run: Run, ports: LegPorts, outcome: ToolOutcome, inbox_bytes: int, now: float) -> PendingRequest | None:
    """Records a runtime's answer to a dispatched nested call.

    Returns:
        The settled request, or ``None`` when the answer is for an unknown,
        finished or already answered call (ignored, SPEC §3.5 item 6).
    """
    p = next((q for q in run.pending.values() if q.nested_call_id == outcome.nested_call_id and q.dispatched), None)
    if p is None or p.result is not None:
        return None
    log.info(
        "tool_call.answered",
        run_id=run.run_id,
        bridge_id=p.bridge_id,
        nested_call_id=p.nested_call_id,
        outcome="ok" if outcome.ok_json is not None else ("oversized" if outcome.oversized_bytes else outcome.error_kind or "failed"),
    )
    try:
        value = ports.project_result(p, outcome, inbox_bytes)
    except RecursionError:
        end_tool_call(run, p.nested_call_id, "error", "too_deep")
        reject(run, p, msg.not_json(p.entry["entry"].id if p.entry else p.method), "internal", "", now)
        return p
    except BridgeReplyError as exc:
        end_tool_call(run, p.nested_call_id, "error", outcome.error_kind if outcome.ok_json is None else f"refused_{exc.provenance}")
        reject(run, p, exc.message, exc.provenance, exc.code or "", now)
        return p
    end_tool_call(run, p.nested_call_id, "ok")
    try:
        p.result = (True, compact_json(value), "")
    except NotSerializableError:
        reject(run, p, msg.not_json(p.entry["entry"].id if p.entry else p.method), "internal", "", now)
        return p
    p.settled_at = now
    return p


def dispatch_request(run: Run, ports: LegPorts, p: PendingRequest, reserve_slot: Callable[[Run], bool]) -> bool:
    """Sends one nested call to the runtime.

    Before the run's first dispatch it takes a suspended-run slot (SPEC §10.4
    item 3); ``bridgeDispatchStarted`` becomes true just before the dispatch.

    Returns:
        False when no slot was free (nothing was dispatched).
    """
    if not run.holds_slot and not reserve_slot(run):
        return False
    run.dispatch_started = True
    p.dispatched = True
    p.nested_call_id = run.next_nested_call_id()
    assert p.entry is not None
    start_tool_call(run, p)
    if not p.entry.get("replaySafe"):
        run.non_replay_safe_dispatched = True
    log.info("tool_call.dispatched", run_id=run.run_id, bridge_id=p.bridge_id, nested_call_id=p.nested_call_id, method=p.method, tool_id=str(getattr(p.entry.get("entry"), "id", "")))
    ports.dispatch(run, p)
    return True


def process_request(run: Run, ports: LegPorts, p: PendingRequest, now: float) -> str:
    """Does the host-side work of a new bridge request that needs no cell.

    ``search`` and ``describe`` are answered (or rejected) at once; a timer
    gets its due time; a nested call is resolved and its input contract
    checked (a refusal settles it). Counters grow here (SPEC §8.3 item 5).

    Returns:
        ``"settled"`` (a result is ready), ``"timer"``, ``"yield"`` or
        ``"nested"`` (ready to dispatch).
    """
    args = p.args
    if p.method in ("search", "describe"):
        p.replay_safe = True
        count(run, ports, p.method)
        try:
            if p.method == "search":
                value = ports.search(args[0] if args else None, args[1] if len(args) > 1 else None)
            else:
                value = ports.describe(args[0] if args else None)
        except BridgeReplyError as exc:
            reject(run, p, exc.message, exc.provenance, exc.code or "", now)
            return "settled"
        p.result = (True, compact_json(value), "")
        p.settled_at = now
        return "settled"
    if p.method == "timer":
        delay = args[0] if args and isinstance(args[0], int | float) and not isinstance(args[0], bool) else 0
        p.replay_safe = True
        p.dispatched = True
        p.due_at = time.time() + max(0.0, float(delay)) / 1000.0
        return "timer"
    if p.method == "yield":
        p.replay_safe = True
        return "yield"
    count(run, ports, "call")
    try:
        entry = ports.resolve(p.method, args)
    except BridgeReplyError as exc:
        reject(run, p, exc.message, exc.provenance, exc.code or "", now)
        return "settled"
    p.entry = entry
    p.replay_safe = bool(entry.get("replaySafe"))
    return "nested"


def count(run: Run, ports: LegPorts, kind: str) -> None:
    """Counts one bridge request in the run and in the catalog session."""
    key = "call" if kind in ("call", "callValue", "namespace") else kind
    run.counts[key] += 1
    ports.count(key)
    record_bridge_call(key)


def restart_safe_label(p: PendingRequest) -> str:
    """The ``<tool>`` of [R03]: the requested id text, or the namespace path."""
    if p.method == "namespace":
        path = p.args[1] if len(p.args) > 1 else ""
        return f"MCP.{path}" if isinstance(path, str) else "MCP"
    text = p.args[0] if p.args else ""
    return text if isinstance(text, str) else json.dumps(text)


def reply_inbox_bytes(run: Run) -> int:
    """SPEC §2.3: ``min(memoryLimitBytes, maxSnapshotBytes)``."""
    return min(run.limits.memory_limit_bytes, run.limits.max_snapshot_bytes)


class Leg:
    """Runs one leg of ``run`` in a fresh cell.

    Args:
        run: The run (state persists across legs).
        executor: Starts the cell.
        ports: The leg's connection to the runtime (tool calls, output,
            cancellation) and the catalog.
        deadline: Absolute ``loop.time()`` of the leg's deadline.
        socket_base: Host directory for per-cell bridge socket directories.
        source: The prepared program for an exec leg; ``None`` when resuming.
        reserve_slot: Called before the run's first dispatch or suspension;
            returns False when no suspended-run slot is free (SPEC §10.7).
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
        reserve_slot: Callable[[Run], bool],
        snapshots: SnapshotStore,
        pool: WarmPool | None = None,
    ) -> None:
        self.run_ = run
        self.executor = executor
        self.ports = ports
        self.deadline = deadline
        self.socket_base = socket_base
        self.source = source
        self._reserve_slot = reserve_slot
        self._snapshots = snapshots
        self.pool = pool
        self._events: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self._tasks: list[asyncio.Task[Any]] = []
        self._bridge: CellBridge | None = None
        self._cell: Cell | None = None
        self._suspend_sent = False
        self._terminal: LegOutcome | None = None
        #: Controller refusals of this leg by (method, refusal kind): how many.
        self._refusals_logged: dict[tuple[str, str], int] = {}
        #: Output entries accepted in this leg, in production order.
        self.accepted_output: list[dict[str, Any]] = []
        self._log = log.bind(run_id=run.run_id, session_id=run.session_id, agent_run_id=run.agent_run_id, tool_call_id=run.tool_call_id)
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
            self.trace.finish(outcome.status, outcome.code)
            return outcome

    async def _run_cell(self) -> LegOutcome:
        loop = asyncio.get_running_loop()
        run = self.run_
        run.legs += 1
        # A warm cell (started and attached ahead of time) when the pool has
        # one of this size; otherwise a fresh cell. Either serves this leg only.
        warm = self.pool.acquire(run.limits.memory_limit_bytes) if self.pool is not None else None
        cell_id = warm.cell.cell_id if warm is not None else "cell_" + secrets.token_hex(8)
        self._log = self._log.bind(cell_id=cell_id)
        structlog.contextvars.bind_contextvars(cell_id=cell_id)
        self.trace.acquiring(cell_id)
        try:
            if warm is not None:
                self._bridge, self._cell = warm.bridge, warm.cell
            else:
                try:
                    self._bridge = await CellBridge.open(self.socket_base, socket_uid=self.executor.cell_uid)
                except OSError as exc:
                    return failed("runtime_unavailable", msg.r11(f"the bridge socket could not be created ({exc.__class__.__name__})"))
                spec = CellSpec(cell_id=cell_id, bridge_dir=self._bridge.directory, cell_token=self._bridge.token, memory_limit_bytes=run.limits.memory_limit_bytes)
                try:
                    self._cell = await self.executor.start(spec)
                except CellStartError as exc:
                    self._log.error("cell.start_failed", reason=str(exc))
                    return failed("runtime_unavailable", msg.r11(str(exc)))
            self._log.debug("cell.started", runtime_id=self._cell.runtime_id)
            self.trace.started(self._cell.runtime_id)
            outcome = await self._attach_and_drive(loop, cell_id)
            outcome.cell_id = cell_id
            return outcome
        finally:
            await self._cleanup()

    async def _cleanup(self) -> None:
        for task in self._tasks:
            task.cancel()
        if self._cell is not None:
            try:
                await self._cell.remove()
            except Exception as exc:  # noqa: BLE001 - cleanup must go on
                self._log.error("cell.remove_failed", error=exc.__class__.__name__)
        if self._bridge is not None:
            await self._bridge.close()

    def _spawn(self, coro: Awaitable[Any]) -> None:
        self._tasks.append(asyncio.ensure_future(coro))

    async def _pump_inbox(self) -> None:
        assert self._bridge is not None
        while True:
            item = await self._bridge.inbox.get()
            await self._events.put(("guest", item))
            if item is None:
                return

    async def _watch_cell(self) -> None:
        assert self._cell is not None
        code = await self._cell.wait()
        await self._events.put(("exit", code))

    async def _pump_runtime(self) -> None:
        while True:
            event = await self.ports.next_event()
            await self._events.put(event)
            if event[0] == "cancel":
                return

    async def _attach_and_drive(self, loop: asyncio.AbstractEventLoop, cell_id: str) -> LegOutcome:
        assert self._bridge is not None and self._cell is not None
        run = self.run_
        self._spawn(self._watch_cell())
        self._spawn(self._pump_runtime())
        # Wait for the cell to authenticate, exit, or the caller to cancel.
        attached = asyncio.ensure_future(self._bridge.attached.wait())
        self._tasks.append(attached)
        while not attached.done():
            get = asyncio.ensure_future(self._events.get())
            done, _ = await asyncio.wait({attached, get}, timeout=ATTACH_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED)
            if get in done:
                kind, value = get.result()
                if kind == "exit":
                    self._log.error("cell.exited_before_attach", exit_code=value)
                    return failed("runtime_unavailable", msg.r12(value) if value else msg.R13)
                if kind == "cancel":
                    return failed("aborted", msg.R07)
                await self._events.put((kind, value))
            else:
                get.cancel()
                if not done:
                    return failed("runtime_unavailable", msg.r11("the cell did not attach to its bridge in time"))
        self.trace.attached()
        snapshot = self._snapshots.get(run.run_id) if self.source is None else None
        if self.source is None and snapshot is None:
            return failed("runtime_unavailable", msg.r18("its snapshot is no longer stored"))
        if snapshot is not None and run.engine_build_id and self._bridge.engine_build_id != run.engine_build_id:
            return failed("runtime_unavailable", msg.R19)
        run.engine_build_id = self._bridge.engine_build_id
        self._spawn(self._pump_inbox())
        remaining_ms = max(1, int((self.deadline - loop.time()) * 1000))
        start = bpb.Start(
            run_id=run.run_id,
            source=self.source or "",
            limits=bpb.LegLimits(
                deadline_ms=remaining_ms,
                memory_limit_bytes=run.limits.memory_limit_bytes,
                max_pending_tool_calls=run.limits.max_pending_tool_calls,
                reply_inbox_bytes=self.reply_inbox_bytes,
                max_output_bytes=run.limits.max_output_bytes,
                output_spent_bytes=run.budget.spent,
                output_closed=run.budget.closed,
            ),
            catalog_json=compact_json(self.ports.guest_catalog()),
            bridge_counters=run.bridge_counters,
            snapshot_bytes=len(snapshot) if snapshot is not None else 0,
        )
        self._bridge.send(bpb.AttachResponse(start=start))
        if snapshot is not None:
            data = snapshot
            self.trace.restoring(len(data))
            for i in range(0, len(data), _CHUNK):
                self._bridge.send(bpb.AttachResponse(snapshot_chunk=bpb.SnapshotChunk(data=data[i : i + _CHUNK], last=i + _CHUNK >= len(data))))
            # Deliver what settled while the run was suspended, in completion order.
        for p in sorted((p for p in run.pending.values() if p.result is not None), key=lambda p: p.settled_at):
            self._deliver(p)
        if not run.restart_safe:
            self._dispatch_undispatched()
            for p in run.pending.values():
                if p.method == "timer" and p.result is None:
                    self._arm_timer(p)
        return await self._settle_loop(loop)

    @property
    def reply_inbox_bytes(self) -> int:
        """The reply inbox of the run (SPEC §2.3)."""
        return reply_inbox_bytes(self.run_)

    # ---------------------------------------------------------- settle loop
    async def _settle_loop(self, loop: asyncio.AbstractEventLoop) -> LegOutcome:
        run = self.run_
        snapshot_parts: list[bytes] = []
        kill_at = self.deadline + WATCHDOG_GRACE_MS / 1000
        while True:
            now = loop.time()
            if now >= self.deadline and not self._suspend_sent and self._host_work():
                # Waiting for host work at the deadline is not a timeout: park.
                self._suspend()
            timeout = (self.deadline - now) if now < self.deadline else (kill_at - now)
            try:
                kind, value = await asyncio.wait_for(self._events.get(), timeout=max(0.0, timeout))
            except TimeoutError:
                if loop.time() >= kill_at:
                    assert self._cell is not None
                    await self._cell.kill()
                    self._log.warning("cell.killed_by_watchdog")
                    self._abandon_dispatched()
                    return failed("timeout", msg.r06(run.limits.timeout_ms))
                continue
            if kind == "cancel":
                self._abandon_dispatched()
                return failed("aborted", msg.R07 if value != "scope" else msg.R08)
            if kind == "exit":
                # A clean `end` is always queued before the exit can be seen
                # unless the cell died; drain what is already queued first.
                outcome = self._drain_after_exit(value, loop)
                if outcome is not None:
                    return outcome
                continue
            if kind == "tool_result":
                self._on_tool_result(value, loop)
                continue
            if kind == "timer":
                p = run.pending.get(value)
                if p is not None and p.result is None:
                    p.result = (True, "null", "")
                    p.settled_at = loop.time()
                    self._maybe_deliver(p, loop)
                continue
            if kind == "settled":
                # A cellblock-hosted MCP call already recorded its result on the run.
                p = run.pending.get(value)
                if p is not None and p.result is not None:
                    self._maybe_deliver(p, loop)
                continue
            if kind != "guest":
                continue
            ending = self._on_guest(value, snapshot_parts)
            if self._terminal is not None:
                self._abandon_dispatched()
                return self._terminal
            if ending is not None:
                return await ending

    def _on_guest(self, value: Any, snapshot_parts: list[bytes]) -> Awaitable[LegOutcome] | None:
        loop = asyncio.get_running_loop()
        self.trace.guest_spoke()
        if value is None:
            # The stream ended; the exit watcher reports how.
            return None
        which = value.WhichOneof("message")
        if which == "request":
            self._on_request(value.request, loop)
        elif which == "output":
            self._on_output(value.output.entry_json)
        elif which == "omission":
            self._on_omission(value.omission)
        elif which == "idle":
            self._on_idle(value.idle.host_work)
        elif which == "snapshot_chunk":
            snapshot_parts.append(value.snapshot_chunk.data)
        elif which == "end":
            return self._on_end(value.end, snapshot_parts, loop)
        else:
            self._log.error("bridge.invalid_message", kind=which)
            self._terminal = failed("internal_error", msg.R17)
        return None

    def _drain_after_exit(self, code: int, loop: asyncio.AbstractEventLoop) -> LegOutcome | None:
        run = self.run_
        if code == bpb.CELL_EXIT_CODE_WATCHDOG or (loop.time() >= self.deadline and not self._suspend_sent):
            self._abandon_dispatched()
            self._log.warning("cell.stopped_at_deadline", exit_code=code)
            return failed("timeout", msg.r05(run.limits.timeout_ms))
        # Let any queued guest messages (including `end`) be processed first.
        if not self._events.empty():
            self._events.put_nowait(("exit", code))
            return None
        self._abandon_dispatched()
        if code == 137 or code < 0:
            self._log.error("cell.killed", exit_code=code)
            return failed("runtime_unavailable", msg.r09(run.limits.memory_limit_bytes) if code == 137 else msg.r12(code))
        self._log.error("cell.exited", exit_code=code)
        return failed("runtime_unavailable", msg.r12(code) if code else msg.R13)

    def _host_work(self) -> bool:
        return bool(self.run_.pending)

    def _suspend(self) -> None:
        assert self._bridge is not None
        self._suspend_sent = True
        self.trace.suspend_requested()
        self._bridge.send(bpb.AttachResponse(suspend=bpb.Suspend()))

    # ---------------------------------------------------------- requests
    def _reject(self, p: PendingRequest, message: str, provenance: str, code: str = "") -> None:
        reject(self.run_, p, message, provenance, code, time.monotonic())

    def _on_request(self, req: bpb.GuestRequest, loop: asyncio.AbstractEventLoop) -> None:
        run = self.run_
        m = _BRIDGE_ID.match(req.bridge_id)
        if req.method not in _METHODS:
            self._log.error("bridge.protocol", bridge_id=req.bridge_id, message=msg.p01(req.method))
            return
        if not m or m.group(1) != req.method:
            self._log.error("bridge.protocol", bridge_id=req.bridge_id, message=msg.p02(req.bridge_id))
            return
        n = int(m.group(2))
        if req.refusal != bpb.GUEST_REFUSAL_UNSPECIFIED:
            self._on_refused(req, n)
            return
        if req.bridge_id in run.seen_bridge_ids:
            self._log.error("bridge.protocol", bridge_id=req.bridge_id, message=msg.p03(req.bridge_id))
            return
        run.seen_bridge_ids.add(req.bridge_id)
        run.bridge_counters[req.method] = max(run.bridge_counters.get(req.method, 0), n)
        try:
            args = json.loads(req.args_json)
            if not isinstance(args, list):
                raise ValueError("arguments are not an array")
        except ValueError:
            self._log.error("bridge.invalid_arguments", bridge_id=req.bridge_id)
            args = []
        p = PendingRequest(bridge_id=req.bridge_id, method=req.method, args=args)
        run.pending[p.bridge_id] = p
        self._handle(p, loop)

    def _on_refused(self, req: bpb.GuestRequest, first: int) -> None:
        """Records requests the controller already refused and rejected (SPEC §8.2 items 3-4, 6).

        One message stands for ``refused_count`` consecutive ids. The guest numbers each
        method's requests upwards, so a range that does not start above every id seen
        for the method reuses one [P03]. Only the first refusal of a leg is logged per
        method and kind; the rest are counted on the record written when the leg ends.
        """
        run = self.run_
        last = first + max(1, req.refused_count) - 1
        if first <= run.bridge_counters.get(req.method, 0) or last >= 10**16:
            self._log.error("bridge.protocol", bridge_id=req.bridge_id, message=msg.p03(req.bridge_id))
            return
        run.bridge_counters[req.method] = last
        provenance = "input" if req.refusal in (bpb.GUEST_REFUSAL_TOO_LARGE, bpb.GUEST_REFUSAL_NAMESPACE_ARGUMENTS) else "internal"
        ranges = run.refused_ranges
        if ranges and ranges[-1][0] == req.method and ranges[-1][2] == first - 1 and ranges[-1][3] == provenance:
            ranges[-1] = (req.method, ranges[-1][1], last, provenance)
        else:
            ranges.append((req.method, first, last, provenance))
        if req.method in _NESTED:
            for _ in range(first, last + 1):
                count(run, self.ports, "call")
        kind = (req.method, bpb.GuestRefusal.Name(req.refusal))
        if kind not in self._refusals_logged:
            self._log.warning("bridge.refused_by_guest", bridge_id=req.bridge_id, method=req.method, refusal=kind[1], refused_count=last - first + 1)
        self._refusals_logged[kind] = self._refusals_logged.get(kind, 0) + last - first + 1

    def _handle(self, p: PendingRequest, loop: asyncio.AbstractEventLoop) -> None:
        kind = process_request(self.run_, self.ports, p, loop.time())
        if self.run_.restart_safe:
            return  # held until the guest is idle (SPEC §10.8 item 2)
        if kind == "settled":
            self._maybe_deliver(p, loop)
        elif kind == "timer":
            self._arm_timer(p)
        elif kind == "yield":
            # A yield parks the leg at once (SPEC §10.4 item 1).
            if not self._suspend_sent:
                self._suspend()
        elif kind == "nested":
            self._dispatch(p, loop)

    def _arm_timer(self, p: PendingRequest) -> None:
        delay = max(0.0, p.due_at - time.time())

        async def fire() -> None:
            await asyncio.sleep(delay)
            await self._events.put(("timer", p.bridge_id))

        self._spawn(fire())

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
            if all(p.method == "namespace" for p in unsafe):
                self._terminal = failed("invalid_input", msg.R02)
            else:
                first = unsafe[0]
                self._terminal = failed("invalid_input", msg.r03(restart_safe_label(first)))
            return
        self._suspend()

    def _dispatch_undispatched(self) -> None:
        loop = asyncio.get_running_loop()
        for p in list(self.run_.pending.values()):
            if p.method in _NESTED and not p.dispatched and p.entry is not None and p.result is None:
                self._dispatch(p, loop)

    def _dispatch(self, p: PendingRequest, loop: asyncio.AbstractEventLoop) -> None:
        if loop.time() >= self.deadline or self._suspend_sent:
            return  # held for the next wait (SPEC §10.9 item 3)
        if not dispatch_request(self.run_, self.ports, p, self._reserve_slot):
            self._terminal = failed("invalid_input", msg.R01)

    def _on_tool_result(self, outcome: ToolOutcome, loop: asyncio.AbstractEventLoop) -> None:
        p = record_tool_outcome(self.run_, self.ports, outcome, self.reply_inbox_bytes, loop.time())
        if p is not None:
            self._maybe_deliver(p, loop)

    def _maybe_deliver(self, p: PendingRequest, loop: asyncio.AbstractEventLoop) -> None:
        if self._suspend_sent:
            return
        if self.deadline - loop.time() < min_resume_budget_s(self.run_.limits.timeout_ms):
            return  # kept for the next wait
        self._deliver(p)

    def _deliver(self, p: PendingRequest) -> None:
        assert self._bridge is not None and p.result is not None
        ok, payload, code = p.result
        self.run_.pending.pop(p.bridge_id, None)
        if ok:
            settle = bpb.Settle(bridge_id=p.bridge_id, ok_json=payload)
        else:
            settle = bpb.Settle(bridge_id=p.bridge_id, error=bpb.BridgeError(message=payload, code=code))
        self._bridge.send(bpb.AttachResponse(settle=settle))

    def _abandon_dispatched(self) -> None:
        for p in self.run_.pending.values():
            if p.dispatched and p.nested_call_id and p.result is None:
                self._log.info("tool_call.abandoned", bridge_id=p.bridge_id, nested_call_id=p.nested_call_id)
                self.ports.cancel_notice(p.nested_call_id)

    # ---------------------------------------------------------- output/end
    def _on_output(self, entry_json: str) -> None:
        try:
            entry = json.loads(entry_json)
        except ValueError:
            self._log.error("bridge.invalid_output")
            return
        if self.run_.budget.offer(entry):
            self.accepted_output.append(entry)
            self.ports.output(entry)

    def _on_omission(self, omission: bpb.OutputOmission) -> None:
        """Records entries the cell's controller omitted (SPEC §9 rule 11), as they are reported."""
        try:
            first = json.loads(omission.first_omitted_content or '""')
        except ValueError:
            first = ""
        self.run_.budget.record_omitted(max(0, omission.omitted_entries), max(0, omission.omitted_bytes), first if isinstance(first, str) else "")

    async def _on_end(self, end: bpb.LegEnd, snapshot_parts: list[bytes], loop: asyncio.AbstractEventLoop) -> LegOutcome:
        run = self.run_
        which = end.WhichOneof("outcome")
        if which == "completed":
            try:
                value = json.loads(end.completed.value_json)
            except ValueError:
                self._log.error("bridge.invalid_value")
                return failed("internal_error", msg.R17)
            return LegOutcome(status="completed", value=value)
        if which == "suspended":
            data = b"".join(snapshot_parts)
            if len(data) != end.suspended.snapshot_bytes:
                self._log.error("bridge.snapshot_size_mismatch")
                return failed("internal_error", msg.R17)
            if len(data) > run.limits.max_snapshot_bytes:
                self._abandon_dispatched()
                self._log.warning("snapshot.too_large", snapshot_bytes=len(data))
                self.trace.snapshot_stored(len(data), end.suspended.raw_bytes, error="snapshot_limit_exceeded")
                return failed("snapshot_limit_exceeded", msg.r14(len(data), run.limits.max_snapshot_bytes))
            if not run.holds_slot and not self._reserve_slot(run):
                self._abandon_dispatched()
                return failed("invalid_input", msg.R01)
            self._snapshots.put(run.run_id, data)
            run.suspended = True
            run.snapshot_bytes = len(data)
            self.trace.snapshot_stored(len(data), end.suspended.raw_bytes)
            reason = "yield" if run.pending and all(p.method == "yield" for p in run.pending.values()) else "pending_tools"
            return LegOutcome(status="waiting", reason=reason, extra={"raw_bytes": end.suspended.raw_bytes})
        if which == "failed":
            self._abandon_dispatched()
            f = end.failed
            kind = f.kind
            text = _guest_text(f.message) if kind in _GUEST_TEXT_KINDS else f.message
            if kind == bpb.FAILURE_KIND_GUEST_ERROR:
                self._log.warning("guest.failed", **error_head(text))
                return failed("internal_error", text, phase="guest")
            if kind == bpb.FAILURE_KIND_BRIDGE_REJECTION:
                provenance = run.provenance_of(f.rejection_bridge_id)
                if provenance is None:
                    # Not a rejection the host delivered: a guest-made error.
                    self._log.warning("guest.failed", **error_head(text))
                    return failed("internal_error", text, phase="guest")
                return failed("invalid_input" if provenance == "input" else "internal_error", text, phase="bridge")
            if kind == bpb.FAILURE_KIND_UNSETTLEABLE:
                self._log.warning("guest.unsettleable")
                return failed("internal_error", msg.R04, phase="guest")
            if kind == bpb.FAILURE_KIND_MEMORY:
                self._log.error("cell.memory_exhausted")
                return failed("runtime_unavailable", msg.r09(run.limits.memory_limit_bytes))
            if kind == bpb.FAILURE_KIND_ENGINE_TRAP:
                self._log.error("cell.engine_trap", detail=f.message[:200])
                return failed("runtime_unavailable", msg.R10)
            if kind == bpb.FAILURE_KIND_INTERRUPTED:
                self._log.warning("cell.interrupted_at_deadline")
                return failed("timeout", msg.r05(run.limits.timeout_ms))
            if kind == bpb.FAILURE_KIND_SYNTAX:
                # The engine refused the source before it ran: report it like
                # source preparation would (S02); its column is not reliable.
                line_text, _, engine_message = text.partition(":")
                line = int(line_text) if line_text.isdigit() else 1
                return failed("invalid_input", msg.s02(line, 1, engine_message), phase="input")
            if kind == bpb.FAILURE_KIND_UNSERIALISABLE:
                return failed("output_limit_exceeded", msg.r15(f.message))
        self._log.error("bridge.invalid_end")
        return failed("internal_error", msg.R17)
