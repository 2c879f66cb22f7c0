"""Request policy: what the host does with each bridge request, with or without a cell.

Pure run-state logic shared by the leg and the cell-free part of a wait: admitting a
request (SPEC §8.2), answering ``search``/``describe``, resolving nested calls, counting
(SPEC §8.3 item 5), dispatching (with the suspended-run slot, SPEC §10.4 item 3) and
recording the runtime's answers (SPEC §3.5).
"""

from __future__ import annotations

import json
import re
import time
from enum import Enum

import structlog
from structlog.typing import FilteringBoundLogger

from cellblock.bridge.v1 import bridge_service_pb2 as bpb
from cellblock.server import messages as msg
from cellblock.server.catalog import BridgeReplyError, strict_json
from cellblock.server.limits import MAX_VALUE_DEPTH
from cellblock.server.runs._large_json import JsonText
from cellblock.server.runs._output import NotSerializableError, compact_json
from cellblock.server.runs._ports import LegPorts
from cellblock.server.runs._protocol import BridgeMethod, ProtocolViolation, Provenance, Settlement, ToolOutcome
from cellblock.server.runs._state import PendingRequest, Run, provenance_key
from cellblock.server.telemetry import end_tool_call, record_bridge_call, start_tool_call

log = structlog.get_logger("cellblock.leg")

_BRIDGE_ID = re.compile(r"^bridge:([A-Za-z]+):([1-9][0-9]{0,15})$")
_METHODS = frozenset(m.value for m in BridgeMethod)
#: Refusals the controller made for the model's input (the rest are internal).
_INPUT_REFUSALS = frozenset({bpb.GUEST_REFUSAL_TOO_LARGE, bpb.GUEST_REFUSAL_NAMESPACE_ARGUMENTS, bpb.GUEST_REFUSAL_TOO_DEEP})


class Next(Enum):
    """What a processed request needs next (:func:`process_request`)."""

    SETTLED = "settled"
    """A result is ready to deliver."""
    TIMER = "timer"
    """A timer to arm."""
    YIELD = "yield"
    """A yield: park the leg (SPEC §10.4 item 1)."""
    NESTED = "nested"
    """A resolved nested call, ready to dispatch."""


def reply_inbox_bytes(run: Run) -> int:
    """SPEC §2.3: ``min(memoryLimitBytes, maxSnapshotBytes)``."""
    return min(run.limits.memory_limit_bytes, run.limits.max_snapshot_bytes)


def reject(run: Run, p: PendingRequest, message: str, provenance: Provenance, code: str, now: float) -> None:
    """Settles a request with a host rejection and records its provenance (SPEC §8.2 item 6)."""
    p.result = Settlement.rejection(message, code)
    p.settled_at = now
    run.provenance[p.bridge_id] = provenance
    log.warning("bridge.rejected", run_id=run.run_id, bridge_id=p.bridge_id, nested_call_id=p.nested_call_id or None, provenance=provenance, reason=message[:200])


def _reject_reply(run: Run, p: PendingRequest, exc: BridgeReplyError, now: float) -> None:
    reject(run, p, exc.message, Provenance(exc.provenance), exc.code or "", now)


def admit_request(
    run: Run, req: bpb.GuestRequest, leg_log: FilteringBoundLogger, refusals: dict[tuple[str, str], int], parsed: tuple[list[object] | None, bool] | None = None
) -> PendingRequest | ProtocolViolation | None:
    """Checks a guest request's method and id and records it on the run (SPEC §8.2).

    A protocol violation (P01-P03, P05) is logged and returned for the leg to reject back;
    requests the controller already refused are recorded by :func:`admit_refused`.

    Args:
        run: The run.
        req: The guest's request.
        leg_log: The leg's bound logger.
        refusals: The leg's refusal counts by ``(method, refusal kind)``.
        parsed: ``args_json`` as a worker read it (``_large_json.args_in_worker``), else it is read here.

    Returns:
        The new pending request, the violation to reject back, or ``None`` when there
        is nothing to answer.
    """
    m = _BRIDGE_ID.fullmatch(req.bridge_id)
    if req.method not in _METHODS:
        return _violation(run, req.bridge_id, msg.p01(req.method), leg_log)
    if not m or m.group(1) != req.method:
        return _violation(run, req.bridge_id, msg.p02(req.bridge_id), leg_log)
    method = BridgeMethod(req.method)
    n = int(m.group(2))
    if req.refusal != bpb.GUEST_REFUSAL_UNSPECIFIED:
        return admit_refused(run, req, method, n, leg_log, refusals)
    if req.bridge_id in run.seen_bridge_ids or n <= run.bridge_counters.get(req.method, 0):
        # The controller numbers each method's requests upwards: an id at or below the
        # method's counter (its admitted and refused requests) is one already used.
        return _violation(run, req.bridge_id, msg.p03(req.bridge_id), leg_log)
    too_deep = False
    if parsed is not None:
        args, too_deep = parsed
    else:
        try:
            args = strict_json(req.args_json, MAX_VALUE_DEPTH + 1)  # each argument: the array holds them
        except RecursionError:  # deeper than the value nesting bound (or the parser): [B23] in refuse_over_host_limits
            args, too_deep = [], True
        except ValueError:
            args = None
    if not isinstance(args, list):
        return _violation(run, req.bridge_id, msg.p05(req.bridge_id), leg_log)
    run.seen_bridge_ids.add(req.bridge_id)
    run.bridge_counters[req.method] = max(run.bridge_counters.get(req.method, 0), n)
    p = PendingRequest(bridge_id=req.bridge_id, method=method, args=args, too_deep=too_deep)
    run.pending[p.bridge_id] = p
    return p


def _violation(run: Run, bridge_id: str, message: str, leg_log: FilteringBoundLogger) -> ProtocolViolation:
    """Logs a protocol violation (bounded) and records its rejection as the host's (SPEC §14.5)."""
    leg_log.error("bridge.protocol", message=message[:300])
    run.provenance.setdefault(provenance_key(bridge_id), Provenance.INTERNAL)
    return ProtocolViolation(bridge_id, message)


def admit_refused(
    run: Run, req: bpb.GuestRequest, method: BridgeMethod, first: int, leg_log: FilteringBoundLogger, refusals: dict[tuple[str, str], int]
) -> ProtocolViolation | None:
    """Records requests the controller already refused and rejected (SPEC §8.2 items 3-4, 6).

    One message stands for ``refused_count`` consecutive ids (0 or less: one). The guest
    numbers each method's requests upwards, so a range that does not start above every id
    seen for the method reuses one ([P03]), and one that runs past 16 digits names ids the
    bridge cannot have ([P02]): both are rejected back like any protocol violation (the
    controller ignores the answer; SPEC §14.5). Only the first refusal of a leg is logged
    per method and kind; the rest are counted in ``refusals`` for the record written when
    the leg ends.

    Returns:
        The violation to reject back, else ``None`` (a recorded refusal has no answer).
    """
    last = first + max(1, req.refused_count) - 1
    if last >= 10**16:
        return _violation(run, req.bridge_id, msg.p02(req.bridge_id), leg_log)
    if first <= run.bridge_counters.get(req.method, 0):
        return _violation(run, req.bridge_id, msg.p03(req.bridge_id), leg_log)
    run.bridge_counters[req.method] = last
    provenance = Provenance.INPUT if req.refusal in _INPUT_REFUSALS else Provenance.INTERNAL
    ranges = run.refused_ranges
    if ranges and ranges[-1][0] == req.method and ranges[-1][2] == first - 1 and ranges[-1][3] == provenance:
        ranges[-1] = (req.method, ranges[-1][1], last, provenance)
    else:
        ranges.append((req.method, first, last, provenance))
    if method.nested:
        # One addition for the whole range: the guest names its length (up to 10**16 ids).
        count(run, BridgeMethod.CALL, last - first + 1)
    # A kind this host does not know (a forged or newer agent) is logged by its number, never raised on.
    kind = (req.method, bpb.GuestRefusal.Name(req.refusal) if req.refusal in bpb.GuestRefusal.values() else f"GUEST_REFUSAL_{req.refusal}")
    if kind not in refusals:
        leg_log.warning("bridge.refused_by_guest", bridge_id=req.bridge_id, method=req.method, refusal=kind[1], refused_count=last - first + 1)
    refusals[kind] = refusals.get(kind, 0) + last - first + 1
    return None


def refuse_over_host_limits(run: Run, p: PendingRequest, now: float) -> bool:
    """The host's second layer of the guest's limits; True when it rejected ``p`` (settled).

    A nested call beyond ``maxPendingToolCalls`` (a guest that got past its own count, e.g. a
    ``toJSON`` that calls tools) gets [B24]; arguments nested deeper than ``MAX_VALUE_DEPTH``
    levels (counted exactly when read) or too deep for the host to serialise again get [B23]
    (SPEC §8.8 rule 7).
    """
    nested = p.method.nested
    unanswered = sum(1 for q in run.pending.values() if q is not p and q.method.nested and q.result is None)
    if nested and unanswered >= run.limits.max_pending_tool_calls:
        count(run, BridgeMethod.CALL)
        reject(run, p, msg.b24(run.limits.max_pending_tool_calls), Provenance.INTERNAL, "", now)
        return True
    try:
        if p.too_deep:
            raise NotSerializableError("nesting is too deep for the serialiser")
        if not any(isinstance(arg, JsonText) for arg in p.args):  # a worker already serialised those
            compact_json(p.args)
    except NotSerializableError:
        if nested:
            count(run, BridgeMethod.CALL)
        reject(run, p, msg.b23(p.method.value), Provenance.INPUT, "", now)
        return True
    return False


def count(run: Run, kind: BridgeMethod, requests: int = 1) -> None:
    """Counts ``requests`` bridge requests in the run and in the catalog session (SPEC §8.3 item 5)."""
    key = BridgeMethod.CALL if kind.nested else kind
    run.counts[key] += requests
    if key is BridgeMethod.CALL:
        # search/describe are counted by the view as it answers them.
        run.view.count_call(requests)
    record_bridge_call(key.value, requests)


def process_request(run: Run, p: PendingRequest, now: float) -> Next:
    """Does the host-side work of a new bridge request that needs no cell.

    ``search`` and ``describe`` are answered (or rejected) at once; a timer
    gets its due time; a nested call is resolved and its input contract
    checked (a refusal settles it). Counters grow here (SPEC §8.3 item 5).
    """
    args = p.args
    if p.method in (BridgeMethod.SEARCH, BridgeMethod.DESCRIBE):
        p.replay_safe = True
        count(run, p.method)
        try:
            if p.method is BridgeMethod.SEARCH:
                text = compact_json(run.view.search(args[0] if args else None, args[1] if len(args) > 1 else None))
            else:
                # Megabytes for a large schema: the view answers with text it built from the
                # schema texts the worker wrote at registration (SPEC §2.3 "loop hold").
                text = run.view.describe_json(args[0] if args else None)
        except BridgeReplyError as exc:
            _reject_reply(run, p, exc, now)
            return Next.SETTLED
        p.result = Settlement.value(text)
        p.settled_at = now
        return Next.SETTLED
    if p.method is BridgeMethod.TIMER:
        delay = args[0] if args and isinstance(args[0], int | float) and not isinstance(args[0], bool) else 0
        p.replay_safe = True
        p.dispatched = True
        p.due_at = time.time() + max(0.0, float(delay)) / 1000.0
        return Next.TIMER
    if p.method is BridgeMethod.YIELD:
        p.replay_safe = True
        return Next.YIELD
    count(run, BridgeMethod.CALL)
    try:
        call = run.view.resolve_call(p.method, args)
    except BridgeReplyError as exc:
        _reject_reply(run, p, exc, now)
        return Next.SETTLED
    p.call = call
    p.replay_safe = call.replay_safe
    return Next.NESTED


def settle_yields(run: Run, now: float) -> None:
    """Settles every pending ``yield`` with ``{status: "yielded", reason}`` (SPEC §10.6 item 3)."""
    for p in run.pending.values():
        if p.method is BridgeMethod.YIELD and p.result is None:
            reason = p.args[0] if p.args else None
            p.result = Settlement.value(compact_json({"status": "yielded", "reason": reason}))
            p.settled_at = now


def dispatchable(p: PendingRequest) -> bool:
    """A resolved nested call that has not gone out and has no result yet."""
    return p.method.nested and not p.dispatched and p.call is not None and not p.call.input_unchecked and p.result is None


def dispatch_request(run: Run, ports: LegPorts, p: PendingRequest) -> None:
    """Sends one nested call to the runtime.

    The run already holds its suspended-run slot (taken in the run store before its
    first dispatch, SPEC §10.4 item 3); ``bridgeDispatchStarted`` becomes true just
    before the dispatch.
    """
    assert run.holds_slot, "a nested call is dispatched only by a run holding a slot"
    run.dispatch_started = True
    p.dispatched = True
    p.nested_call_id = run.next_nested_call_id()
    assert p.call is not None
    start_tool_call(run, p)
    if not p.call.replay_safe:
        run.non_replay_safe_dispatched = True
    log.info("tool_call.dispatched", run_id=run.run_id, bridge_id=p.bridge_id, nested_call_id=p.nested_call_id, method=p.method, tool_id=p.call.entry.id)
    ports.dispatch(run, p)


def record_tool_outcome(run: Run, outcome: ToolOutcome, now: float) -> PendingRequest | None:
    """Records a runtime's answer to a dispatched nested call.

    Returns:
        The settled request, or ``None`` when the answer is for an unknown,
        finished or already answered call (ignored, SPEC §3.5 item 6).
    """
    p = next((q for q in run.pending.values() if q.nested_call_id == outcome.nested_call_id and q.dispatched), None)
    if p is None or p.result is not None or p.call is None:
        return None
    log.info(
        "tool_call.answered",
        run_id=run.run_id,
        bridge_id=p.bridge_id,
        nested_call_id=p.nested_call_id,
        outcome="ok" if outcome.ok_json is not None else ("oversized" if outcome.oversized_bytes else outcome.error_kind or "failed"),
    )
    label = p.call.entry.id
    try:
        value = run.view.project_result(p.method, p.call, outcome, reply_inbox_bytes(run))
    except RecursionError:
        end_tool_call(run, p.nested_call_id, "error", "too_deep")
        reject(run, p, msg.b29(label), Provenance.INTERNAL, "", now)
        return p
    except BridgeReplyError as exc:
        end_tool_call(run, p.nested_call_id, "error", outcome.error_kind if outcome.ok_json is None else f"refused_{exc.provenance}")
        _reject_reply(run, p, exc, now)
        return p
    end_tool_call(run, p.nested_call_id, "ok")
    try:
        p.result = Settlement.value(value.text if isinstance(value, JsonText) else compact_json(value))
    except NotSerializableError:
        reject(run, p, msg.not_json(label), Provenance.INTERNAL, "", now)
        return p
    p.settled_at = now
    return p


def restart_safe_label(p: PendingRequest) -> str:
    """The ``<tool>`` of [R03]: the requested id text, or the namespace path."""
    if p.method is BridgeMethod.NAMESPACE:
        path = p.args[1] if len(p.args) > 1 else ""
        return f"MCP.{path}" if isinstance(path, str) else "MCP"
    text = p.args[0] if p.args else ""
    return text if isinstance(text, str) else json.dumps(text)
