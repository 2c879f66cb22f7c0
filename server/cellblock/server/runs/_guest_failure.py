"""Leg-end mapping: a cell's ``LegEnd`` (completed, failed) and exit codes to an outcome.

The table of SPEC §11.1-§11.3: which failure kind becomes which error code and failure
phase, and which message text the model sees ([R04], [R05], [R09], [R10], [R12], [R13],
[R15], [S02]). Guest text (the program's own error) is passed through; everything else
uses the §14 texts. A completed leg's value is parsed only when it may fit the run's
output budget (SPEC §9 rule 6).
"""

from __future__ import annotations

import json

from structlog.typing import FilteringBoundLogger

from cellblock.bridge.v1 import bridge_service_pb2 as bpb
from cellblock.server import messages as msg
from cellblock.server.catalog import strict_json
from cellblock.server.limits import MAX_VALUE_DEPTH
from cellblock.server.logging import error_head
from cellblock.server.runs._protocol import ErrorCode, FailurePhase, LegOutcome, Provenance, RunStatus, failed
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


def _text_bytes(message_bytes: int) -> int:
    """The UTF-8 length of ``value_json`` from its ``Completed`` message's size (tag and length framing taken off).

    Comparing the message's size itself with the allowance sent a text that fits it, but not
    with its 2-6 bytes of framing, to :meth:`~OutputBudget.final_text`, which parsed it
    without this function's strict checks (``NaN`` reached the caller as ``null``).
    """
    for framing in range(2, 12):
        n = message_bytes - framing
        if n >= 0 and max(1, (n.bit_length() + 6) // 7) == framing - 1:
            return n
    return message_bytes


def completed_outcome(run: Run, completed: bpb.Completed, log: FilteringBoundLogger) -> LegOutcome:
    """The outcome of a leg whose program returned (SPEC §9 rule 6).

    A value whose message is larger than the run's final allowance cannot be returned whole:
    it is kept as the text the cell sent (``value_text``) for the runner to truncate, never
    parsed (parsing costs many times its size). Sized without building the string.

    Returns:
        ``completed``; [R15] when it nests deeper than ``MAX_VALUE_DEPTH`` levels (counted
        exactly, or beyond the host's parser); [R17] when a value
        small enough to parse is not JSON.
    """
    if _text_bytes(completed.ByteSize()) > run.budget.final_allowance():
        log.info("bridge.value_over_allowance", message_bytes=completed.ByteSize())
        return LegOutcome(status=RunStatus.COMPLETED, value_text=completed.value_json)
    try:
        return LegOutcome(status=RunStatus.COMPLETED, value=strict_json(completed.value_json, MAX_VALUE_DEPTH))
    except RecursionError:  # deeper than the value nesting bound (or the parser): SPEC §8.8 rule 7
        return failed(ErrorCode.OUTPUT_LIMIT_EXCEEDED, msg.r15(f"nesting is deeper than {MAX_VALUE_DEPTH} levels"))
    except ValueError:
        log.error("bridge.invalid_value")
        return failed(ErrorCode.INTERNAL_ERROR, msg.R17)


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
