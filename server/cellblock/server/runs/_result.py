"""Builders for the model-facing result objects of SPEC §10.5, with exact key order."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from cellblock.server.runs._output import JsonText, compact_json
from cellblock.server.runs._protocol import BridgeMethod, ErrorCode, FailurePhase

ERROR_CODES = frozenset(code.value for code in ErrorCode)
"""The error codes of SPEC §11.1."""

FAILURE_PHASES = frozenset(phase.value for phase in FailurePhase)
"""The ``failurePhase`` values of SPEC §11.2."""

BRIDGE_METHODS = frozenset(method.value for method in BridgeMethod)
"""The bridge methods that may appear in ``pendingToolCalls``."""

VISIBLE_TOOLS = ("exec", "wait")


def make_telemetry(
    *,
    catalog_size: int = 0,
    sources: Mapping[str, int] | None = None,
    search_count: int = 0,
    describe_count: int = 0,
    call_count: int = 0,
    counter_scope: str = "",
) -> dict[str, Any]:
    """Builds a telemetry object (SPEC §12 item 1) in key order.

    Args:
        catalog_size: Entries of the run's catalog view.
        sources: Entry counts by source; missing sources count 0.
        search_count: Cumulative ``search`` requests of the catalog session.
        describe_count: Cumulative ``describe`` requests of the catalog session.
        call_count: Cumulative nested calls of the catalog session.
        counter_scope: 12 lower-case hex digits naming the counter lifetime.

    Returns:
        ``{catalogSize, sources: {host, mcp, client}, searchCount, describeCount,
        callCount, counterScope, visibleTools: ["exec", "wait"]}``.
    """
    counts = sources or {}
    return {
        "catalogSize": catalog_size,
        "sources": {
            "host": int(counts.get("host", 0)),
            "mcp": int(counts.get("mcp", 0)),
            "client": int(counts.get("client", 0)),
        },
        "searchCount": search_count,
        "describeCount": describe_count,
        "callCount": call_count,
        "counterScope": counter_scope,
        "visibleTools": list(VISIBLE_TOOLS),
    }


def _telemetry(telemetry: Mapping[str, Any]) -> dict[str, Any]:
    return make_telemetry(
        catalog_size=int(telemetry.get("catalogSize", 0)),
        sources=telemetry.get("sources"),
        search_count=int(telemetry.get("searchCount", 0)),
        describe_count=int(telemetry.get("describeCount", 0)),
        call_count=int(telemetry.get("callCount", 0)),
        counter_scope=str(telemetry.get("counterScope", "")),
    )


def completed_result(
    *,
    value: Any,
    output: Sequence[Mapping[str, Any]],
    replay_safe: bool,
    telemetry: Mapping[str, Any],
) -> dict[str, Any]:
    """Builds a ``completed`` result.

    Args:
        value: The final value, already projected by the output budget.
        output: This leg's accepted entries followed by its marker, if any.
        replay_safe: The run's ``replaySafe`` fact (SPEC §10.8 rule 3).
        telemetry: Telemetry keyed as in SPEC §10.5 (re-ordered here).

    Returns:
        ``{status, value, output, replaySafe, telemetry}``.
    """
    return {
        "status": "completed",
        "value": value,
        "output": [dict(entry) for entry in output],
        "replaySafe": bool(replay_safe),
        "telemetry": _telemetry(telemetry),
    }


def waiting_result(
    *,
    run_id: str,
    pending_tool_calls: Iterable[tuple[str, str] | Mapping[str, str]],
    output: Sequence[Mapping[str, Any]],
    replay_safe: bool,
    telemetry: Mapping[str, Any],
) -> dict[str, Any]:
    """Builds a ``waiting`` result.

    Args:
        run_id: ``run_`` plus 32 lower-case hex digits.
        pending_tool_calls: Requests the guest has not received results for, in
            bridge-id order, as ``(id, method)`` pairs or ``{"id", "method"}`` dicts.
        output: This leg's accepted entries followed by its marker, if any.
        replay_safe: The run's ``replaySafe`` fact.
        telemetry: Telemetry keyed as in SPEC §10.5.

    Returns:
        ``{status, runId, reason, pendingToolCalls, output, replaySafe, telemetry}``;
        ``reason`` is ``"yield"`` when every pending request is a ``yield``.

    Raises:
        ValueError: ``pending_tool_calls`` is empty or names an unknown method.
    """
    pending: list[dict[str, str]] = []
    for call in pending_tool_calls:
        if isinstance(call, Mapping):
            call_id, method = call["id"], call["method"]
        else:
            call_id, method = call
        if method not in BRIDGE_METHODS:
            raise ValueError(f"unknown bridge method: {method!r}")
        pending.append({"id": call_id, "method": method})
    if not pending:
        raise ValueError("a waiting result needs at least one pending request")
    reason = "yield" if all(call["method"] == "yield" for call in pending) else "pending_tools"
    return {
        "status": "waiting",
        "runId": run_id,
        "reason": reason,
        "pendingToolCalls": pending,
        "output": [dict(entry) for entry in output],
        "replaySafe": bool(replay_safe),
        "telemetry": _telemetry(telemetry),
    }


def failed_result(
    *,
    error: str,
    code: ErrorCode | str,
    failure_phase: FailurePhase | str,
    bridge_dispatch_started: bool,
    output: Sequence[Mapping[str, Any]],
    replay_safe: bool,
    telemetry: Mapping[str, Any],
) -> dict[str, Any]:
    """Builds a ``failed`` result.

    Args:
        error: The error text, already projected by the output budget.
        code: One of :data:`ERROR_CODES`.
        failure_phase: One of :data:`FAILURE_PHASES`.
        bridge_dispatch_started: True once any nested call of the run was dispatched.
        output: This leg's accepted entries followed by its marker, if any.
        replay_safe: The run's ``replaySafe`` fact.
        telemetry: Telemetry keyed as in SPEC §10.5.

    Returns:
        ``{status, error, code, failurePhase, bridgeDispatchStarted, output,
        replaySafe, telemetry}``.

    Raises:
        ValueError: ``code`` or ``failure_phase`` is not a known value.
    """
    if code not in ERROR_CODES:
        raise ValueError(f"unknown error code: {code!r}")
    if failure_phase not in FAILURE_PHASES:
        raise ValueError(f"unknown failure phase: {failure_phase!r}")
    return {
        "status": "failed",
        "error": error,
        "code": str(code),
        "failurePhase": str(failure_phase),
        "bridgeDispatchStarted": bool(bridge_dispatch_started),
        "output": [dict(entry) for entry in output],
        "replaySafe": bool(replay_safe),
        "telemetry": _telemetry(telemetry),
    }


def input_failed_result(
    message: str, *, replay_safe: bool, telemetry: Mapping[str, Any]
) -> dict[str, Any]:
    """Builds the ``failed`` result of an input-phase refusal (SPEC §5, §6).

    Args:
        message: The [E..], [W..] or [S..] message.
        replay_safe: The effective restartSafe value for ``exec`` (nothing ran), and
            False for ``wait``.
        telemetry: Telemetry of the caller's scope (zeros without a catalog).

    Returns:
        A ``failed`` result with ``invalid_input``, phase ``input``,
        ``bridgeDispatchStarted: false`` and empty output.
    """
    return failed_result(
        error=message,
        code=ErrorCode.INVALID_INPUT,
        failure_phase=FailurePhase.INPUT,
        bridge_dispatch_started=False,
        output=[],
        replay_safe=replay_safe,
        telemetry=telemetry,
    )


#: Characters of output entries serialized between two turns of the event loop (:func:`result_json`).
RESULT_JSON_SLICE_CHARS = 512 * 1024


async def result_json(result: Mapping[str, Any]) -> str:
    """The compact JSON of a result, its ``output`` entries written a slice at a time (SPEC §2.3 "loop hold").

    A leg's output reaches ``maxOutputBytes`` (megabytes of entries); serializing it in one
    call held the shared event loop for 30-60 ms. Entries are written one by one, and the
    loop runs other callbacks after every :data:`RESULT_JSON_SLICE_CHARS` characters; the
    text equals ``compact_json(result)``, keys in the result's order. A ``value`` held as
    :class:`JsonText` (a final value the leg's end read) is spliced in as it is.

    Raises:
        NotSerializableError: A value cannot be serialized.
    """
    parts = []
    for key, value in result.items():
        if isinstance(value, JsonText):
            parts.append(f"{compact_json(key)}:{value.text}")
            continue
        if key != "output":
            parts.append(compact_json({key: value})[1:-1])
            continue
        texts, since_turn = [], 0
        for entry in value:
            text = compact_json(entry)
            texts.append(text)
            since_turn += len(text)
            if since_turn >= RESULT_JSON_SLICE_CHARS:
                await asyncio.sleep(0)
                since_turn = 0
        parts.append(f'{compact_json(key)}:[{",".join(texts)}]')
    return "{" + ",".join(parts) + "}"
