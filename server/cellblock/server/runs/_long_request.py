"""A nested call whose arguments are long JSON text, read and checked in a worker (SPEC §3.1 item 6).

The same steps as a short request (``_policy``: admission, the host's own limits, resolving
the call and its input contract), in the same order and with the same answers, except that
reading the text, serialising it again and checking it against the entry's ``parameters``
happen in the worker pool (``_large_json``) within
:data:`~cellblock.server.limits.LARGE_JSON_BUDGET_MS` and the leg's deadline. A worker over
its budget, or gone, rejects the request with [B25] (input provenance).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable
from dataclasses import dataclass

from structlog.typing import FilteringBoundLogger

from cellblock.bridge.v1 import bridge_service_pb2 as bpb
from cellblock.server import messages as msg
from cellblock.server.catalog import CatalogEntry
from cellblock.server.limits import INLINE_JSON_CHARS, LARGE_JSON_BUDGET_MS, WATCHDOG_GRACE_MS
from cellblock.server.runs._large_json import InputCheck, JsonText, args_checked_in_worker, args_in_worker, input_check_in_worker, portable
from cellblock.server.runs._policy import Next, admit_request, count, process_request, refuse_over_host_limits, reject
from cellblock.server.runs._protocol import BridgeMethod, ProtocolViolation, Provenance
from cellblock.server.runs._state import PendingRequest, Run
from cellblock.server.workers import CpuPool, WorkBudgetExceeded, WorkerFailed

__all__ = ["LONG_REQUEST_BOUND_S", "LongAdmission", "admit_long_request", "is_long_request"]

#: Longest :func:`admit_long_request` takes by its own budgets: two worker calls of at most the
#: long-JSON budget each, plus the pool's half second of slack per call (``CpuPool.run``).
LONG_REQUEST_BOUND_S = 2 * (LARGE_JSON_BUDGET_MS / 1000.0 + 0.5)

_INPUT_AT = {BridgeMethod.CALL.value: 1, BridgeMethod.CALL_VALUE.value: 1, BridgeMethod.NAMESPACE.value: 2}


_DECODER = json.JSONDecoder()
_LEADING_STRING = re.compile(r'[ \t\n\r]*\[[ \t\n\r]*"')


def _named_entry(run: Run, req: bpb.GuestRequest) -> CatalogEntry | None:
    """The entry a ``call``/``callValue`` names by its exact id (the first argument), if it has an input contract.

    Reads only the leading JSON string (the C scanner, from its opening quote), never the rest: the worker
    then checks the input against this entry in the same call that reads it (``args_checked_in_worker``).
    """
    if req.method not in (BridgeMethod.CALL.value, BridgeMethod.CALL_VALUE.value):
        return None
    found = _LEADING_STRING.match(req.args_json)
    if found is None:
        return None
    try:
        tool_id, _end = _DECODER.raw_decode(req.args_json, found.end() - 1)
    except ValueError:
        return None
    entry = run.view.entry(tool_id) if isinstance(tool_id, str) else None
    return entry if entry is not None and entry.input_validator is not None else None


def is_long_request(req: bpb.GuestRequest) -> bool:
    """A nested call (not one the controller refused) whose ``args_json`` is longer than the loop reads."""
    return len(req.args_json) > INLINE_JSON_CHARS and req.method in _INPUT_AT and req.refusal == bpb.GUEST_REFUSAL_UNSPECIFIED


@dataclass(frozen=True)
class LongAdmission:
    """What :func:`admit_long_request` decided.

    Attributes:
        request: The pending request, the protocol violation to reject back, or ``None``.
        step: What the leg does next with the request; ``None`` when the host's own limits
            settled it (deliver it now).
        in_doubt: The controller let through what the host refused ([B23], [B24]).
    """

    request: PendingRequest | ProtocolViolation | None
    step: Next | None = None
    in_doubt: bool = False


async def admit_long_request(
    run: Run,
    req: bpb.GuestRequest,
    cpu: CpuPool,
    left_s: float,
    leg_log: FilteringBoundLogger,
    refusals: dict[tuple[str, str], int],
    clock: Callable[[], float],
) -> LongAdmission:
    """Admits a long nested call (:func:`is_long_request`) as ``Leg._on_request`` admits a short one.

    Args:
        run: The run.
        req: The guest's request.
        cpu: The worker pool.
        left_s: Seconds until the leg's deadline (each worker call's budget ends there, or after the
            watchdog's grace once it has passed).
        leg_log: The leg's bound logger.
        refusals: The leg's refusal counts by ``(method, refusal kind)``.
        clock: ``loop.time`` (settlement times).
    """
    deadline = clock() + left_s
    tenant = (run.session_id, run.agent_run_id)  # the scope's share of the worker pool

    def budget_s() -> float:
        # Within the leg's deadline; past it (the leg is parking) within the watchdog's grace, as
        # a short request would still be admitted and held for the next wait.
        return min(LARGE_JSON_BUDGET_MS / 1000.0, max(deadline - clock(), WATCHDOG_GRACE_MS / 1000.0))

    named = _named_entry(run, req)
    checked: InputCheck | None = None
    try:
        if named is None:
            parsed = await cpu.run(args_in_worker, req.args_json, _INPUT_AT[req.method], budget_s=budget_s(), size=len(req.args_json), tenant=tenant)
        else:  # the input's contract is checked on the value the worker reads, not read again later
            parsed, checked = await cpu.run(args_checked_in_worker, req.args_json, _INPUT_AT[req.method], portable(named), budget_s=budget_s(), size=len(req.args_json), tenant=tenant)
    except (WorkBudgetExceeded, WorkerFailed):
        parsed = None
    p = admit_request(run, req, leg_log, refusals, parsed=parsed or ([], False))
    if not isinstance(p, PendingRequest):
        return LongAdmission(p)
    if parsed is None:
        count(run, BridgeMethod.CALL)
        reject(run, p, msg.b25(req.method, len(req.args_json), LARGE_JSON_BUDGET_MS), Provenance.INPUT, "", clock())
        return LongAdmission(p)
    if refuse_over_host_limits(run, p, clock()):
        return LongAdmission(p, in_doubt=True)
    step = process_request(run, p, clock())
    call = p.call
    if step is Next.NESTED and call is not None and call.input_unchecked and isinstance(call.input, JsonText):
        try:
            if checked is not None and checked[0] == call.entry.id:
                problem = checked[1]
            else:
                problem = await cpu.run(input_check_in_worker, portable(call.entry), call.input.text, budget_s=budget_s(), size=len(call.input.text), tenant=tenant)
        except (WorkBudgetExceeded, WorkerFailed):
            problem = (msg.b25(req.method, len(req.args_json), LARGE_JSON_BUDGET_MS), "input", None)
        if problem is not None:
            reject(run, p, problem[0], Provenance(problem[1]), problem[2] or "", clock())
            return LongAdmission(p, Next.SETTLED)
        p.call = dataclasses.replace(call, input_unchecked=False)
    return LongAdmission(p, step)
