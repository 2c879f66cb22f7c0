"""Leg-end mapping: a cell's ``LegEnd.failed`` and exit codes to an outcome.

The table of SPEC §11.1-§11.3: which failure kind becomes which error code and failure
phase, and which message text the model sees ([R04], [R05], [R09], [R10], [R12], [R13],
[R15], [S02]). Guest text (the program's own error) is passed through; everything else
uses the §14 texts. A completed leg's value is read in ``_final_value``.
"""

from __future__ import annotations

import json

from structlog.typing import FilteringBoundLogger

from cellblock.bridge.v1 import bridge_service_pb2 as bpb
from cellblock.server import messages as msg
from cellblock.server.logging import error_head
from cellblock.server.runs._protocol import ErrorCode, FailurePhase, LegOutcome, Provenance, failed
from cellblock.server.runs._state import Run

#: Failure kinds whose message is guest text sent as a JSON string literal.
_GUEST_TEXT_KINDS = frozenset({bpb.FAILURE_KIND_GUEST_ERROR, bpb.FAILURE_KIND_BRIDGE_REJECTION, bpb.FAILURE_KIND_SYNTAX, bpb.FAILURE_KIND_MEMORY})

#: The exit code of a cell killed by SIGKILL (128 + 9): the kernel's OOM killer or ``docker kill``.
#: (The guest's own exit codes are ``bpb.CellExitCode``.)
EXIT_KILLED = 137


def guest_text(literal: str) -> str:
    """Decodes guest text sent as a JSON string literal; malformed text is kept raw."""
    try:
        value = json.loads(literal)
    except (ValueError, RecursionError):
        return literal
    return value if isinstance(value, str) else literal


def guest_failure(run: Run, f: bpb.Failed, log: FilteringBoundLogger) -> LegOutcome:
    """Maps the guest's report of a failed leg to its outcome (SPEC §11.1-§11.3).

    Args:
        run: The run (its provenance record and limits).
        f: The ``LegEnd.failed`` message.
        log: The leg's bound logger.

    Returns:
        The failed outcome; an unknown kind is ``internal_error`` [R17].
    """
    kind = f.kind
    text = guest_text(f.message) if kind in _GUEST_TEXT_KINDS else f.message
    if kind == bpb.FAILURE_KIND_GUEST_ERROR:
        log.warning("guest.failed", **error_head(text))
        return failed(ErrorCode.INTERNAL_ERROR, text, FailurePhase.GUEST)
    if kind == bpb.FAILURE_KIND_BRIDGE_REJECTION:
        provenance = run.provenance_of(f.rejection_bridge_id)
        if provenance is None:
            # Not a rejection the host delivered: a guest-made error.
            log.warning("guest.failed", **error_head(text))
            return failed(ErrorCode.INTERNAL_ERROR, text, FailurePhase.GUEST)
        code = ErrorCode.INVALID_INPUT if provenance is Provenance.INPUT else ErrorCode.INTERNAL_ERROR
        return failed(code, text, FailurePhase.BRIDGE)
    if kind == bpb.FAILURE_KIND_UNSETTLEABLE:
        log.warning("guest.unsettleable")
        return failed(ErrorCode.INTERNAL_ERROR, msg.R04, FailurePhase.GUEST)
    if kind == bpb.FAILURE_KIND_MEMORY:
        log.error("cell.memory_exhausted")
        return failed(ErrorCode.RUNTIME_UNAVAILABLE, msg.r09(run.limits.memory_limit_bytes))
    if kind == bpb.FAILURE_KIND_ENGINE_TRAP:
        log.error("cell.engine_trap", detail=f.message[:200])
        return failed(ErrorCode.RUNTIME_UNAVAILABLE, msg.R10)
    if kind == bpb.FAILURE_KIND_INTERRUPTED:
        log.warning("cell.interrupted_at_deadline")
        return failed(ErrorCode.TIMEOUT, msg.r05(run.limits.timeout_ms))
    if kind == bpb.FAILURE_KIND_SYNTAX:
        # The engine refused the source before it ran: report it like
        # source preparation would (S02); its column is not reliable.
        line_text, _, engine_message = text.partition(":")
        line = int(line_text) if len(line_text) <= 9 and line_text.isascii() and line_text.isdigit() else 1  # guest text: "²" is a digit int() refuses
        return failed(ErrorCode.INVALID_INPUT, msg.s02(line, 1, engine_message), FailurePhase.INPUT)
    if kind == bpb.FAILURE_KIND_UNSERIALISABLE:
        return failed(ErrorCode.OUTPUT_LIMIT_EXCEEDED, msg.r15(f.message))
    log.error("bridge.invalid_end")
    return failed(ErrorCode.INTERNAL_ERROR, msg.R17)


def exit_failure(run: Run, code: int, log: FilteringBoundLogger, *, out_of_memory: bool = False, bridge_bound: int = 0) -> LegOutcome:
    """Maps the exit of an attached cell that ended without ``LegEnd`` (SPEC §11.1).

    Exit 137 is SIGKILL: [R09] only when the engine reports the memory limit
    (``out_of_memory``), else a kill from outside the cell, [R12] (SPEC §10.10). Exit 0:
    the cell's bridge refused its end unread, over ``bridge_bound`` bytes ([R15]).
    """
    if code == EXIT_KILLED or code < 0:
        log.error("cell.killed", exit_code=code, out_of_memory=out_of_memory)
        return failed(ErrorCode.RUNTIME_UNAVAILABLE, msg.r09(run.limits.memory_limit_bytes) if out_of_memory else msg.r12(code))
    if code == 0:
        # The guest agent exits 0 only after sending its end: the host's bridge refused that
        # message unread, over the run's bridge bound (SPEC §2.3, §9 rule 6).
        log.warning("cell.end_refused", max_message_bytes=bridge_bound)
        return failed(ErrorCode.OUTPUT_LIMIT_EXCEEDED, msg.r15(msg.too_large_to_read(bridge_bound)))
    log.error("cell.exited", exit_code=code)
    return failed(ErrorCode.RUNTIME_UNAVAILABLE, msg.r12(code))
