"""A completed leg's final value: read once at the leg's end, projected into the run's output budget (SPEC §9 rule 6).

The value reaches the host's bridge bound (about 11 MiB with ``maxOutputBytes`` at its
most). The leg's end reads a value that may fit the allowance once (:func:`read_final_value`:
strict JSON, the nesting bound, its compact JSON), in a worker process when its text is longer
than :data:`~cellblock.server.limits.INLINE_JSON_CHARS`; the runner's projection measures that
compact text and the result splices it in as it is. A value over the allowance is never read:
its truncation marker is built from the text the cell sent, in a worker when that is long. So
no step over a long value runs on the shared event loop (SPEC §2.3 item 6).
"""

from __future__ import annotations

from typing import Any

from structlog.typing import FilteringBoundLogger

from cellblock.bridge.v1 import bridge_service_pb2 as bpb
from cellblock.server import messages as msg
from cellblock.server.limits import INLINE_JSON_CHARS, LARGE_JSON_BUDGET_MS
from cellblock.server.runs._large_json import JsonText, final_marker_in_worker, read_final_value
from cellblock.server.runs._output import NotSerializableError
from cellblock.server.runs._protocol import ErrorCode, LegOutcome, RunStatus, failed
from cellblock.server.runs._state import Run
from cellblock.server.workers import CpuPool, WorkBudgetExceeded, WorkerFailed

__all__ = ["completed_outcome", "project_final"]


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


def _busy_reason() -> str:
    return f"the host could not read it within {LARGE_JSON_BUDGET_MS} ms"


async def completed_outcome(run: Run, completed: bpb.Completed, log: FilteringBoundLogger, cpu: CpuPool) -> LegOutcome:
    """The outcome of a leg whose program returned (SPEC §9 rule 6).

    A value whose message is larger than the run's final allowance cannot be returned whole:
    it is kept as the text the cell sent (``value_text``) for the runner to truncate, never
    parsed (parsing costs many times its size). Sized without building the string. Any other
    value is read once (:func:`read_final_value`; in the worker pool within
    :data:`~cellblock.server.limits.LARGE_JSON_BUDGET_MS` when its text is long) and kept as
    its compact JSON.

    Returns:
        ``completed`` with a :class:`JsonText` value (or ``value_text``); [R15] when it nests
        deeper than ``MAX_VALUE_DEPTH`` levels (counted exactly, or beyond the host's parser),
        or a worker could not read it within its budget; [R17] when a value small enough to
        parse is not JSON.
    """
    if _text_bytes(completed.ByteSize()) > run.budget.final_allowance():
        log.info("bridge.value_over_allowance", message_bytes=completed.ByteSize())
        return LegOutcome(status=RunStatus.COMPLETED, value_text=completed.value_json)
    text = completed.value_json
    if len(text) <= INLINE_JSON_CHARS:
        read = read_final_value(text)
    else:
        try:
            read = await cpu.run(read_final_value, text, budget_s=LARGE_JSON_BUDGET_MS / 1000.0, size=len(text), tenant=(run.session_id, run.agent_run_id))
        except (WorkBudgetExceeded, WorkerFailed):
            log.warning("bridge.value_unread", value_chars=len(text))
            return failed(ErrorCode.OUTPUT_LIMIT_EXCEEDED, msg.r15(_busy_reason()))
    if isinstance(read, JsonText):
        return LegOutcome(status=RunStatus.COMPLETED, value=read)
    if read is None:
        log.error("bridge.invalid_value")
        return failed(ErrorCode.INTERNAL_ERROR, msg.R17)
    return failed(ErrorCode.OUTPUT_LIMIT_EXCEEDED, msg.r15(read))


async def project_final(run: Run, outcome: LegOutcome, cpu: CpuPool) -> Any:
    """The completed leg's ``value`` in its result: the value, or its truncation marker (SPEC §9 rule 6).

    Call after the leg's own marker has counted (``OutputBudget.end_leg``). A long text over
    the allowance gets its marker from a worker, as compact JSON (:class:`JsonText`; building it
    walked the text on the loop before: 5.5 s for an 11 MB value over a 10 MiB budget).

    Raises:
        NotSerializableError: The value cannot be projected (the caller fails the run with [R15]).
    """
    budget = run.budget
    text = outcome.value_text if outcome.value_text is not None else outcome.value.text if isinstance(outcome.value, JsonText) else None
    if text is None or len(text) <= INLINE_JSON_CHARS or budget.fits(text):
        return budget.final_value(outcome.value) if outcome.value_text is None else budget.final_text(outcome.value_text)
    try:
        return await cpu.run(final_marker_in_worker, text, budget.final_allowance(), budget_s=LARGE_JSON_BUDGET_MS / 1000.0, size=len(text), tenant=(run.session_id, run.agent_run_id))
    except (WorkBudgetExceeded, WorkerFailed):
        raise NotSerializableError(_busy_reason()) from None
