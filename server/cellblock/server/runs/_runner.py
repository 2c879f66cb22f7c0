"""The run lifecycle: exec and wait flows around legs (SPEC §10.2, §10.6).

:class:`Runner` validates the model's arguments, prepares the source, creates
or claims the run, runs one :class:`~cellblock.server.runs._leg.Leg`, and
projects the outcome into the model-facing result object (SPEC §10.5).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import structlog

from cellblock.server import messages as msg
from cellblock.server.cells import Executor, WarmPool
from cellblock.server.config import CodeModeConfig, Limits
from cellblock.server.runs._leg import Leg, LegOutcome, dispatch_request, failed, record_tool_outcome, reply_inbox_bytes
from cellblock.server.runs._output import OutputBudget, compact_json
from cellblock.server.runs._ports import LegPorts
from cellblock.server.runs._registry import RunRegistry
from cellblock.server.runs._result import completed_result, failed_result, waiting_result
from cellblock.server.runs._state import Run, new_run_id, replay_id
from cellblock.server.source import InputFailure, prepare_source, validate_exec, validate_wait
from cellblock.server.telemetry import remember_exec_span

log = structlog.get_logger("cellblock.runs")


async def _fire_timer(ports: LegPorts, p: Any) -> None:
    """Reports a suspended run's timer as due through the wait's event queue."""
    await asyncio.sleep(max(0.0, p.due_at - time.time()))
    await ports.events.put(("timer", p.bridge_id))  # type: ignore[attr-defined]


@dataclass(frozen=True)
class LegReport:
    """A finished leg: the model-facing result and run metadata.

    Attributes:
        result: The result object of SPEC §10.5 (key order preserved).
        status: ``completed``, ``waiting`` or ``failed``.
        code: The error code when failed, else ``""``.
        run_id: The run id when waiting, else ``""``.
        run: The run, when one was created.
        cell_id: The cell that ran the leg, if any.
    """

    result: dict[str, Any]
    status: str
    code: str
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
    """

    def __init__(self, config: CodeModeConfig, executor: Executor, registry: RunRegistry, socket_base: str, pool: WarmPool | None = None) -> None:
        self.config = config
        self.pool = pool
        self.executor = executor
        self.registry = registry
        self.socket_base = socket_base

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
        overrides: dict[str, Any],
        view: Any,
        ports: LegPorts,
        telemetry: Any,
    ) -> LegReport:
        """Runs an exec leg (SPEC §10.2).

        Args:
            view: The scope's frozen catalog view.
            ports: The stream and catalog connection of the leg.
            telemetry: Callable returning the scope's telemetry dict.
        """
        loop = asyncio.get_running_loop()
        self.registry.sweep()
        limits: Limits = self.config.limits_with_overrides(overrides)
        deadline = loop.time() + limits.timeout_ms / 1000.0
        checked = validate_exec(
            arguments_json,
            enabled=self.config.enabled,
            languages=self.config.languages,
            force_restart_safe=force_restart_safe,
            max_source_bytes=limits.max_source_bytes,
        )
        if isinstance(checked, InputFailure):
            restart = force_restart_safe
            log.warning("exec.invalid_input", reason=checked.message[:200])
            return self._input_failure(checked.message, restart, telemetry())
        prepared = prepare_source(checked.source, checked.language)
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
        self.registry.add(run)
        remember_exec_span(run)
        structlog.contextvars.bind_contextvars(run_id=run.run_id)
        return await self._run_leg(run, ports, deadline, prepared.text, telemetry)

    # ------------------------------------------------------------------ wait
    async def wait(
        self,
        *,
        session_id: str,
        agent_run_id: str,
        arguments_json: str,
        ports: LegPorts,
        telemetry: Any,
        on_claim: Any = None,
    ) -> LegReport:
        """Runs a wait leg (SPEC §10.6)."""
        loop = asyncio.get_running_loop()
        run_id = validate_wait(arguments_json)
        if isinstance(run_id, InputFailure):
            return self._input_failure(run_id.message, False, telemetry())
        tomb = self.registry.cancelled.get(run_id)
        if tomb is not None and tomb.session_id == session_id and tomb.agent_run_id == agent_run_id:
            self.registry.sweep()
            if run_id in self.registry.cancelled:
                return LegReport(failed_result(error=msg.R07, code="aborted", failure_phase="host", bridge_dispatch_started=True, output=[], replay_safe=False, telemetry=telemetry()), "failed", "aborted", "", None)
        claimed = self.registry.claim(run_id)
        if claimed is None:
            return self._input_failure(msg.W03, False, telemetry())
        if claimed == "busy":
            run = self.registry.runs[run_id]
            if run.session_id != session_id:
                return self._input_failure(msg.W04, False, telemetry())
            if run.agent_run_id != agent_run_id:
                return self._input_failure(msg.W05, False, telemetry())
            return self._input_failure(msg.W06, False, telemetry())
        assert isinstance(claimed, Run)
        run = claimed
        if run.session_id != session_id or run.agent_run_id != agent_run_id:
            self.registry.release_claim(run)
            return self._input_failure(msg.W04 if run.session_id != session_id else msg.W05, False, telemetry())
        if on_claim is not None:
            on_claim(run)
        ports.run_id = run.run_id
        structlog.contextvars.bind_contextvars(run_id=run.run_id, tool_call_id=run.tool_call_id)
        deadline = loop.time() + run.limits.timeout_ms / 1000.0
        # Settle pending yields (SPEC §10.6 item 3).
        for p in run.pending.values():
            if p.method == "yield" and p.result is None:
                reason = p.args[0] if p.args else None
                p.result = (True, compact_json({"status": "yielded", "reason": reason}), "")
                p.settled_at = loop.time()
        # Dispatch what a yield, the deadline or restart safety held back;
        # in-flight calls keep running (SPEC §10.6 item 3).
        for p in list(run.pending.values()):
            if p.method in ("call", "callValue", "namespace") and not p.dispatched and p.entry is not None and p.result is None:
                if not dispatch_request(run, ports, p, self.registry.reserve_slot):
                    return self._project(run, failed("invalid_input", msg.R01), telemetry(), [])
        timers = [asyncio.ensure_future(_fire_timer(ports, p)) for p in run.pending.values() if p.method == "timer" and p.result is None]
        try:
            outcome = await self._await_results(run, ports, deadline)
        finally:
            for task in timers:
                task.cancel()
        if outcome is not None:
            return self._project(run, outcome, telemetry(), [])
        budget_s = run.limits.min_resume_budget_ms / 1000.0
        if not any(p.result is not None for p in run.pending.values()) or deadline - loop.time() < budget_s:
            # Nothing to deliver in time: waiting again, same run, expiry not renewed.
            run.legs += 1
            self.registry.release_claim(run)
            result = waiting_result(run_id=run.run_id, pending_tool_calls=run.pending_list(), output=run.budget.end_leg(), replay_safe=run.replay_safe, telemetry=telemetry())
            return LegReport(result, "waiting", "", run.run_id, run)
        return await self._run_leg(run, ports, deadline, None, telemetry)

    async def _await_results(self, run: Run, ports: LegPorts, deadline: float) -> LegOutcome | None:
        """Waits, without a cell, until the wait has something to deliver.

        An ordinary run resumes as soon as one result is available; a
        restart-safe run waits for all of its requests (it resumes once per
        leg, SPEC §10.8 item 2). Returns a terminal outcome on abort.
        """
        loop = asyncio.get_running_loop()
        budget_s = run.limits.min_resume_budget_ms / 1000.0

        def ready() -> bool:
            settled = [p.result is not None for p in run.pending.values()]
            return all(settled) if run.restart_safe else any(settled)

        while not ready():
            remaining = deadline - loop.time() - budget_s
            if remaining <= 0:
                return None
            try:
                kind, value = await asyncio.wait_for(ports.next_event(), timeout=remaining)
            except TimeoutError:
                return None
            if kind == "cancel":
                for p in run.pending.values():
                    if p.dispatched and p.nested_call_id and p.result is None:
                        ports.cancel_notice(p.nested_call_id)
                return failed("aborted", msg.R07 if value != "scope" else msg.R08)
            if kind == "tool_result":
                record_tool_outcome(run, ports, value, reply_inbox_bytes(run), loop.time())
            elif kind == "timer":
                timer = run.pending.get(value)
                if timer is not None and timer.result is None:
                    timer.result = (True, "null", "")
                    timer.settled_at = loop.time()
        return None

    # ------------------------------------------------------------------ legs
    async def _run_leg(self, run: Run, ports: LegPorts, deadline: float, source: str | None, telemetry: Any) -> LegReport:
        ports.run_id = run.run_id
        leg = Leg(
            run,
            self.executor,
            ports,
            deadline=deadline,
            socket_base=self.socket_base,
            source=source,
            reserve_slot=self.registry.reserve_slot,
            snapshots=self.registry.store,
            pool=self.pool,
        )
        started = time.monotonic()
        try:
            outcome = await leg.run()
        except Exception as exc:  # noqa: BLE001 - a service fault ends the run
            log.error("leg.fault", run_id=run.run_id, error_class=exc.__class__.__name__, error=str(exc)[:200], exc_info=True)
            outcome = failed("internal_error", "internal error: the service failed while running this leg.")
        log.debug("leg.ended", run_id=run.run_id, status=outcome.status, code=outcome.code, seconds=round(time.monotonic() - started, 3))
        return self._project(run, outcome, telemetry(), leg.accepted_output)

    def _project(self, run: Run, outcome: LegOutcome, tele: dict[str, Any], accepted: list[dict[str, Any]]) -> LegReport:
        budget = run.budget
        if outcome.status == "completed":
            output = accepted + budget.end_leg()
            value = budget.final_value(outcome.value)
            self.registry.remove(run)
            return LegReport(completed_result(value=value, output=output, replay_safe=run.replay_safe, telemetry=tele), "completed", "", "", run, outcome.cell_id)
        if outcome.status == "waiting":
            output = accepted + budget.end_leg()
            self.registry.park(run, run.limits.snapshot_ttl_seconds)
            result = waiting_result(run_id=run.run_id, pending_tool_calls=run.pending_list(), output=output, replay_safe=run.replay_safe, telemetry=tele)
            return LegReport(result, "waiting", "", run.run_id, run, outcome.cell_id)
        output = accepted + budget.end_leg()
        error = budget.final_error(outcome.message)
        if outcome.code == "aborted":
            self.registry.cancel(run)
        else:
            self.registry.remove(run)
        result = failed_result(error=error, code=outcome.code, failure_phase=outcome.phase or "host", bridge_dispatch_started=run.dispatch_started, output=output, replay_safe=run.replay_safe, telemetry=tele)
        return LegReport(result, "failed", outcome.code, "", run, outcome.cell_id)

    def _input_failure(self, message: str, restart_safe: bool, tele: dict[str, Any]) -> LegReport:
        result = failed_result(error=message, code="invalid_input", failure_phase="input", bridge_dispatch_started=False, output=[], replay_safe=restart_safe, telemetry=tele)
        return LegReport(result, "failed", "invalid_input", "", None)
