"""The run lifecycle: exec and wait flows around legs (SPEC §10.2, §10.6).

:class:`Runner` validates the model's arguments, prepares the source, creates
or claims the run, runs one :class:`~cellblock.server.runs._leg.Leg`, and
projects the outcome into the model-facing result object (SPEC §10.5).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog

from cellblock.server import messages as msg
from cellblock.server.catalog import is_fault
from cellblock.server.cells import Executor, ScopeCells, WarmPool
from cellblock.server.config import CodeModeConfig, Limits
from cellblock.server.limits import DEFAULT_CELL_WAIT_MS, SOURCE_BUDGET_MS
from cellblock.server.runs._codec import RunDecodeError
from cellblock.server.runs._final_value import project_final
from cellblock.server.runs._leg import Leg
from cellblock.server.runs._output import NotSerializableError, OutputBudget
from cellblock.server.runs._policy import settle_yields
from cellblock.server.runs._ports import CatalogPort, LegPorts
from cellblock.server.runs._protocol import (
    Cancelled,
    ClaimBusy,
    ClaimCancelled,
    Claimed,
    ClaimForeign,
    ClaimUnknown,
    ErrorCode,
    FailurePhase,
    LegOutcome,
    RunStatus,
    failed,
    slot_refused,
)
from cellblock.server.runs._registry import RunRegistry
from cellblock.server.runs._result import completed_result, failed_result, waiting_result
from cellblock.server.runs._state import Run, new_run_id, replay_id
from cellblock.server.source import InputFailure, PreparedSource, prepare_source, validate_exec, validate_wait
from cellblock.server.store import SlotAnswer, StoreTimeoutError
from cellblock.server.telemetry import remember_exec_span
from cellblock.server.workers import CpuPool, WorkBudgetExceeded, WorkerBusy, WorkerFailed, cpu_pool

log = structlog.get_logger("cellblock.runs")

#: Returns the scope's telemetry object (SPEC §12 item 1) at the time of the result.
Telemetry = Callable[[], dict[str, Any]]


def _abort_on_loss(ports: LegPorts) -> Callable[[str], None]:
    """Aborts the leg when the store says its run was cancelled elsewhere or taken over."""

    def lost(_status: str) -> None:
        ports.events.put_nowait(Cancelled())

    return lost


@dataclass(frozen=True)
class LegReport:
    """A finished leg: the model-facing result and run metadata.

    Attributes:
        result: The result object of SPEC §10.5 (key order preserved).
        status: ``completed``, ``waiting`` or ``failed``.
        code: The error code when failed, else ``None``.
        run_id: The run id when waiting, else ``""``.
        run: The run, when one was created.
        cell_id: The cell that ran the leg, if any.
    """

    result: dict[str, Any]
    status: RunStatus
    code: ErrorCode | None
    run_id: str
    run: Run | None
    cell_id: str = ""


class Runner:
    """Runs exec and wait legs for one service instance.

    Args:
        config: The deployment's code-mode configuration.
        executor: Starts cells.
        registry: Suspended runs and slots.
        socket_base: Host directory for per-cell bridge socket directories.
        pool: Warm cells, if any.
        cpu: Worker processes for CPU-heavy steps (default: the process-wide pool).
        cell_wait_ms: Bound on waiting for a cell, outside the program's budget ([R21]).
        scope_cells: Cells kept for their scope's next leg (``CELLBLOCK_CELL_REUSE=scope``, SPEC §16.2).
    """

    def __init__(
        self,
        config: CodeModeConfig,
        executor: Executor,
        registry: RunRegistry,
        socket_base: str,
        pool: WarmPool | None = None,
        cpu: CpuPool | None = None,
        cell_wait_ms: int = DEFAULT_CELL_WAIT_MS,
        scope_cells: ScopeCells | None = None,
    ) -> None:
        self.config = config
        self.cell_wait_ms = cell_wait_ms
        self.cpu = cpu or cpu_pool()
        self.pool = pool
        self.scope_cells = scope_cells
        self.executor = executor
        self.registry = registry
        self.socket_base = socket_base
        #: The legs' sweep of expired runs under way, shared by the legs that start meanwhile.
        self._sweeping: asyncio.Future[None] | None = None

    # ------------------------------------------------------------------ exec
    async def exec(
        self,
        *,
        session_id: str,
        agent_run_id: str,
        tool_call_id: str,
        turn_id: str,
        arguments_json: str,
        force_restart_safe: bool,
        overrides: dict[str, int],
        view: CatalogPort,
        ports: LegPorts,
        telemetry: Telemetry,
    ) -> LegReport:
        """Runs an exec leg (SPEC §10.2).

        Args:
            session_id: The scope's session id.
            agent_run_id: The scope's agent run id.
            tool_call_id: The model's tool-call id of this exec (the parent of nested calls).
            turn_id: The turn id, or ``""`` (part of the replay id).
            arguments_json: The model's exec arguments, verbatim (SPEC §5.1).
            force_restart_safe: Run as restart-safe whatever the model said.
            overrides: Per-exec limit overrides, by camelCase limit name.
            view: The scope's frozen catalog view; the run keeps it for all legs.
            ports: The leg's port (the stream and its event queue).
            telemetry: Returns the scope's telemetry object.

        Returns:
            The finished leg.
        """
        loop = asyncio.get_running_loop()
        # Expired runs are swept at the start of every exec (SPEC §10.7 item 5): beside the
        # source's preparation in the worker pool, and done before the run exists unless the
        # store is slower than the cell wait (then it goes on in the background).
        sweeping, sweep_until = self._sweep(), loop.time() + self.cell_wait_ms / 1000.0
        try:
            limits: Limits = self.config.limits_with_overrides(overrides)
            checked = validate_exec(
                arguments_json,
                enabled=self.config.enabled,
                languages=self.config.languages,
                force_restart_safe=force_restart_safe,
                max_source_bytes=limits.max_source_bytes,
            )
            prepared = await self._prepare(checked.source, checked.language, (session_id, agent_run_id)) if not isinstance(checked, InputFailure) else checked
        finally:
            await self._swept(sweeping, sweep_until)
        if isinstance(checked, InputFailure):
            restart = force_restart_safe
            log.warning("exec.invalid_input", reason=checked.message[:200])
            return self._input_failure(checked.message, restart, telemetry())
        if prepared is None:  # no worker started on it within the cell wait: the service is busy
            result = failed_result(error=msg.r24(self.cell_wait_ms), code=ErrorCode.RUNTIME_UNAVAILABLE, failure_phase=FailurePhase.HOST, bridge_dispatch_started=False, output=[], replay_safe=checked.restart_safe, telemetry=telemetry())
            return LegReport(result, RunStatus.FAILED, ErrorCode.RUNTIME_UNAVAILABLE, "", None)
        if isinstance(prepared, InputFailure):
            log.warning("exec.invalid_source", reason=prepared.message[:200])
            return self._input_failure(prepared.message, checked.restart_safe, telemetry())
        run = Run(
            run_id=new_run_id(),
            session_id=session_id,
            agent_run_id=agent_run_id,
            tool_call_id=tool_call_id,
            turn_id=turn_id,
            replay_id=replay_id(session_id, agent_run_id, turn_id, tool_call_id, checked.source),
            limits=limits,
            restart_safe=checked.restart_safe,
            view=view,
            budget=OutputBudget(limits.max_output_bytes),
        )
        # The leg's budget is the program's: it starts once the source is prepared (SPEC §10.2 item 2).
        deadline = loop.time() + limits.timeout_ms / 1000.0
        self.registry.add(run)
        async with self.registry.holding(run, _abort_on_loss(ports)):
            try:
                remember_exec_span(run)
                structlog.contextvars.bind_contextvars(run_id=run.run_id)
                return await self._run_leg(self._leg(run, ports, deadline, prepared.text), telemetry)
            except BaseException as exc:  # every path out of a leg releases what the run holds (a Rust panic too)
                return await self._fault(run, exc, telemetry)

    async def _prepare(self, source: str, language: str, scope: tuple[str, str]) -> PreparedSource | InputFailure | None:
        """Prepares the source in the worker pool within its own budget (SPEC §6, [S05]/[S06]).

        The budget counts from the moment a worker starts on it; waiting for the scope's turn and a
        worker is bounded by the cell wait on its own, so a program is never failed as too costly
        because other scopes filled the pool. Returns ``None`` when that wait ran out ([R24]).
        """
        try:
            return await self.cpu.run(prepare_source, source, language, budget_s=SOURCE_BUDGET_MS / 1000.0, size=len(source), tenant=scope, wait_s=self.cell_wait_ms / 1000.0)
        except WorkerBusy:
            log.warning("source.worker_busy", wait_ms=self.cell_wait_ms)
            return None
        except WorkBudgetExceeded:
            return InputFailure(msg.s05(SOURCE_BUDGET_MS))
        except WorkerFailed:
            return InputFailure(msg.S06)
        except Exception as exc:  # noqa: BLE001 - any other fault of the step also ends only this exec
            log.error("source.fault", error_class=exc.__class__.__name__, error=str(exc)[:200], exc_info=True)
            return InputFailure(msg.S06)

    # ------------------------------------------------------------------ wait
    async def wait(
        self,
        *,
        session_id: str,
        agent_run_id: str,
        arguments_json: str,
        ports: LegPorts,
        telemetry: Telemetry,
        on_claim: Callable[[Run], None] | None = None,
    ) -> LegReport:
        """Runs a wait leg (SPEC §10.6).

        Args:
            session_id: The scope's session id.
            agent_run_id: The scope's agent run id.
            arguments_json: The model's wait arguments, verbatim (SPEC §5.2).
            ports: The leg's port (the stream and its event queue).
            telemetry: Returns the scope's telemetry object.
            on_claim: Called with the run once the wait holds it (the API reports the
                run's own view's telemetry when this replica lacks the scope's catalog).

        Returns:
            The finished leg: the run's result, ``waiting`` again, or a refusal of the wait.
        """
        claimed = await self._claim(arguments_json, session_id, agent_run_id, telemetry)
        # The wait's sweep (SPEC §10.7 item 5) runs behind its claim, beside the leg: the
        # claim itself refuses its run when expired, and a wait takes no new slot.
        sweeping, sweep_until = self._sweep(), asyncio.get_running_loop().time() + self.cell_wait_ms / 1000.0
        try:
            if isinstance(claimed, LegReport):
                return claimed
            run, snapshot = claimed
            async with self.registry.holding(run, _abort_on_loss(ports)):
                try:
                    if on_claim is not None:
                        on_claim(run)
                    return await self._resume(run, snapshot, ports, telemetry)
                except BaseException as exc:  # every path out of a leg releases the claim and the slot (a Rust panic too)
                    return await self._fault(run, exc, telemetry)
        finally:
            await self._swept(sweeping, sweep_until)

    def _sweep(self) -> asyncio.Future[None]:
        """The run store's sweep of expired runs: the one under way, else a new one (legs' sweeps coalesce)."""
        if self._sweeping is None or self._sweeping.done():
            self._sweeping = asyncio.ensure_future(self._sweep_quietly())
        return self._sweeping

    @staticmethod
    async def _swept(sweeping: asyncio.Future[None], until: float) -> None:
        """Waits for a leg's sweep until ``until`` (``loop.time()``) at most; a slower one goes on in the background."""
        await asyncio.wait({sweeping}, timeout=max(0.0, until - asyncio.get_running_loop().time()))

    async def _sweep_quietly(self) -> None:
        """Sweeps expired runs; a failure is logged, never the leg's (the next exec, wait or periodic sweep tries again)."""
        try:
            await self.registry.sweep()
        except Exception as exc:  # noqa: BLE001 - the next exec, wait or periodic sweep tries again
            log.warning("run.sweep_failed", error_class=exc.__class__.__name__, error=str(exc)[:200])

    async def _resume(self, run: Run, snapshot: bytes | None, ports: LegPorts, telemetry: Telemetry) -> LegReport:
        """The wait flow once the run is claimed (SPEC §10.6 items 2-7)."""
        loop = asyncio.get_running_loop()
        ports.run_id = run.run_id
        structlog.contextvars.bind_contextvars(run_id=run.run_id, tool_call_id=run.tool_call_id)
        deadline = loop.time() + run.limits.timeout_ms / 1000.0
        settle_yields(run, loop.time())
        leg = self._leg(run, ports, deadline, None, snapshot)
        # Dispatch what a yield, the deadline or restart safety held back;
        # in-flight calls keep running (SPEC §10.6 item 3).
        refused = await leg.dispatch_held()
        if refused is not None:
            return await self._project(run, refused, telemetry(), [])
        outcome = await leg.await_results()
        if outcome is not None:
            return await self._project(run, outcome, telemetry(), [])
        budget_s = run.limits.min_resume_budget_ms / 1000.0
        if not any(p.result is not None for p in run.pending.values()) or deadline - loop.time() < budget_s:
            # Nothing to deliver in time: waiting again, same run, expiry not renewed.
            run.legs += 1
            await self.registry.release_claim(run)
            result = waiting_result(run_id=run.run_id, pending_tool_calls=run.pending_list(), output=run.budget.end_leg(), replay_safe=run.replay_safe, telemetry=telemetry())
            return LegReport(result, RunStatus.WAITING, None, run.run_id, run)
        return await self._run_leg(leg, telemetry)

    async def _claim(self, arguments_json: str, session_id: str, agent_run_id: str, telemetry: Telemetry) -> tuple[Run, bytes | None] | LegReport:
        """Claims the wait's run for the scope in the run store (SPEC §10.6 items 1-2, §16.1 item 4).

        Returns:
            The run and its stored snapshot, or the refusal's report.
        """
        run_id = validate_wait(arguments_json)
        if isinstance(run_id, InputFailure):
            return self._input_failure(run_id.message, False, telemetry())
        try:
            claimed = await self.registry.claim(run_id, session_id, agent_run_id)
        except RunDecodeError as exc:
            log.error("run.unreadable", run_id=run_id, error=str(exc)[:200])
            return self._host_failure(msg.r18("its stored state cannot be read"), ErrorCode.RUNTIME_UNAVAILABLE, telemetry())
        except StoreTimeoutError:  # a claim that lands later is given back (RunRegistry.claim)
            return self._host_failure(msg.R26, ErrorCode.RUNTIME_UNAVAILABLE, telemetry())
        match claimed:
            case ClaimUnknown():
                return self._input_failure(msg.W03, False, telemetry())
            case ClaimCancelled():
                return self._host_failure(msg.R07, ErrorCode.ABORTED, telemetry())
            case ClaimForeign(other_session=other_session):
                return self._input_failure(msg.W04 if other_session else msg.W05, False, telemetry())
            case ClaimBusy():
                return self._input_failure(msg.W06, False, telemetry())
            case Claimed(run=run, snapshot=snapshot):
                return run, snapshot

    # ------------------------------------------------------------------ legs
    def _leg(self, run: Run, ports: LegPorts, deadline: float, source: str | None, snapshot: bytes | None = None) -> Leg:
        ports.run_id = run.run_id
        return Leg(
            run,
            self.executor,
            ports,
            deadline=deadline,
            socket_base=self.socket_base,
            source=source,
            reserve_slot=self.registry.reserve_slot,
            slot_cap=self.registry.cap,
            snapshot=snapshot,
            pool=self.pool,
            cell_wait_s=self.cell_wait_ms / 1000.0,
            scope_cells=self.scope_cells,
            cpu=self.cpu,
        )

    async def _run_leg(self, leg: Leg, telemetry: Telemetry) -> LegReport:
        run = leg.run_
        started = time.monotonic()
        try:
            outcome = await leg.run()
        except BaseException as exc:  # a service fault ends the run (a Rust extension's panic too)
            if not is_fault(exc):
                raise
            log.error("leg.fault", run_id=run.run_id, error_class=exc.__class__.__name__, error=str(exc)[:200], exc_info=True)
            outcome = failed(ErrorCode.INTERNAL_ERROR, msg.R22)
        log.debug("leg.ended", run_id=run.run_id, status=outcome.status, code=outcome.code or "", seconds=round(time.monotonic() - started, 3))
        try:
            return await self._project(run, outcome, telemetry(), leg.accepted_output)
        except BaseException as exc:  # a projection fault must not leave the run holding its slot
            return await self._fault(run, exc, telemetry)

    async def _fault(self, run: Run, exc: BaseException, telemetry: Telemetry) -> LegReport:
        """Ends a run after a service fault: forgets it (freeing its slot, claim and lease) and reports [R22].

        The registry's cache forgets the run even when the store cannot be reached; the
        store's slot is then freed when the run's lease runs out (SPEC §16.1 item 4). A store
        call that outlived the store wait is [R25] (the removal then ends in the background),
        or [R26] for a wait's release (the run is suspended again once the store answers).
        """
        if not is_fault(exc):
            raise exc  # cancellation and interpreter exits go on
        if isinstance(exc, StoreTimeoutError):
            log.error("leg.store_timeout", run_id=run.run_id, call=exc.call)
            self.registry.calls.finish_later(self.registry.remove(run), what="remove")
            code, text = ErrorCode.RUNTIME_UNAVAILABLE, msg.R26 if exc.call == "release" else msg.R25
        else:
            log.error("leg.fault", run_id=run.run_id, error_class=exc.__class__.__name__, error=str(exc)[:200], exc_info=True)
            try:
                await self.registry.remove(run)
            except Exception as store_exc:  # noqa: BLE001 - the cache is already clear; the lease expires
                log.error("run.remove_failed", run_id=run.run_id, error_class=store_exc.__class__.__name__, error=str(store_exc)[:200])
            code, text = ErrorCode.INTERNAL_ERROR, msg.R22
        result = failed_result(error=text, code=code, failure_phase=FailurePhase.HOST, bridge_dispatch_started=run.dispatch_started, output=[], replay_safe=False, telemetry=telemetry())
        return LegReport(result, RunStatus.FAILED, code, "", run)

    async def _project(self, run: Run, outcome: LegOutcome, tele: dict[str, Any], accepted: list[dict[str, Any]]) -> LegReport:
        budget = run.budget
        # The leg's truncation marker counts toward the budget before the value's allowance, and
        # before a park stores the budget (SPEC §9 rules 5-6).
        markers = budget.end_leg()
        if outcome.status is RunStatus.WAITING:
            failure = failed(ErrorCode.INTERNAL_ERROR, msg.R22)
            parked: SlotAnswer | None = None
            try:
                # A first suspension takes its slot in the park's transaction (one store write).
                parked = await self.registry.park(run, outcome.snapshot) if outcome.snapshot is not None else None
            except StoreTimeoutError:  # a park that lands later is undone (RunRegistry.park)
                failure = failed(ErrorCode.RUNTIME_UNAVAILABLE, msg.R25)
            except Exception as exc:  # noqa: BLE001 - the store failed: nothing is stored, the run fails
                log.error("run.park_failed", run_id=run.run_id, error_class=exc.__class__.__name__, error=str(exc)[:200])
            if parked is not None and not parked:
                failure = slot_refused(parked, self.registry.cap)
            if not parked:
                outcome = failure
        output = accepted + markers
        if outcome.status is RunStatus.COMPLETED:
            try:
                value = await project_final(run, outcome, self.cpu)
            except NotSerializableError as exc:
                cell_id = outcome.cell_id
                outcome = failed(ErrorCode.OUTPUT_LIMIT_EXCEEDED, msg.r15(str(exc)))
                outcome.cell_id = cell_id
            else:
                await self.registry.remove(run)
                return LegReport(completed_result(value=value, output=output, replay_safe=run.replay_safe, telemetry=tele), RunStatus.COMPLETED, None, "", run, outcome.cell_id)
        if outcome.status is RunStatus.WAITING:
            result = waiting_result(run_id=run.run_id, pending_tool_calls=run.pending_list(), output=output, replay_safe=run.replay_safe, telemetry=tele)
            return LegReport(result, RunStatus.WAITING, None, run.run_id, run, outcome.cell_id)
        error = budget.final_error(outcome.message)
        code = outcome.code or ErrorCode.INTERNAL_ERROR
        if code is ErrorCode.ABORTED and self.registry.stopping and run.expires_at > 0:
            # A resumed run has a last park to resume from; an exec's first leg does not and is aborted.
            await self.registry.hand_back(run)
        elif code is ErrorCode.ABORTED:
            await self.registry.cancel(run)
        else:
            await self.registry.remove(run)
        result = failed_result(error=error, code=code, failure_phase=outcome.phase, bridge_dispatch_started=run.dispatch_started, output=output, replay_safe=run.replay_safe, telemetry=tele)
        return LegReport(result, RunStatus.FAILED, code, "", run, outcome.cell_id)

    def _input_failure(self, message: str, restart_safe: bool, tele: dict[str, Any]) -> LegReport:
        result = failed_result(error=message, code=ErrorCode.INVALID_INPUT, failure_phase=FailurePhase.INPUT, bridge_dispatch_started=False, output=[], replay_safe=restart_safe, telemetry=tele)
        return LegReport(result, RunStatus.FAILED, ErrorCode.INVALID_INPUT, "", None)

    def _host_failure(self, message: str, code: ErrorCode, tele: dict[str, Any]) -> LegReport:
        result = failed_result(error=message, code=code, failure_phase=FailurePhase.HOST, bridge_dispatch_started=True, output=[], replay_safe=False, telemetry=tele)
        return LegReport(result, RunStatus.FAILED, code, "", None)
