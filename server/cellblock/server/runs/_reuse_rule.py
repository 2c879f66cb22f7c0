"""Whether a leg's cell may serve its scope's next leg (SPEC §16.2 item 2).

Under ``CELLBLOCK_CELL_REUSE=scope`` a leg takes its scope's kept cell first (then a warm
pooled cell, then a fresh one). At its end the cell is destroyed unless the leg ended in
one of the ways §16.2 item 2 allows; anything else (timeout, abort, out of memory, a trap
or interrupt, a cell that exited, a bridge protocol break or a request past the
controller's own limits, an unknown end) destroys it. The decision is an allow-list:
what is not known to be clean is not reused.
"""

from __future__ import annotations

from cellblock.bridge.v1 import bridge_service_pb2 as bpb
from cellblock.server.runs._protocol import ErrorCode, LegOutcome, RunStatus

#: Guest failure kinds that are the program's own doing (its error, a rejection it
#: did not catch, a syntax error the engine found): the engine and agent are sound.
_GUEST_FAILURES = frozenset({bpb.FAILURE_KIND_GUEST_ERROR, bpb.FAILURE_KIND_BRIDGE_REJECTION, bpb.FAILURE_KIND_SYNTAX})
#: Final codes that always destroy the cell: the leg was cut short or the cell is in doubt.
_DESTROYING_CODES = frozenset({ErrorCode.TIMEOUT, ErrorCode.ABORTED, ErrorCode.RUNTIME_UNAVAILABLE})


def clean_end(end: bpb.LegEnd) -> bool:
    """Whether the guest's ``end`` leaves its cell fit for another leg (SPEC §16.2 item 2).

    Completed and suspended ends qualify (the host still checks what they carry),
    and failures of the program itself; memory exhaustion, engine traps,
    interrupts, unserialisable values, unsettleable programs and unknown ends do not.
    """
    which = end.WhichOneof("outcome")
    if which in ("completed", "suspended"):
        return True
    return which == "failed" and end.failed.kind in _GUEST_FAILURES


def reusable(outcome: LegOutcome, *, clean: bool, protocol_broken: bool, exited: bool) -> bool:
    """The whole rule: a clean end, no bridge protocol break, a live cell, and an outcome that is not cut short.

    Args:
        outcome: The leg's final outcome.
        clean: The guest's ``end`` passed :func:`clean_end` and the host accepted
            what it carried (valid value JSON, a snapshot of the announced size).
        protocol_broken: The cell sent something the bridge protocol does not allow,
            or a request its controller should have refused.
        exited: The cell's process ended.
    """
    if not clean or protocol_broken or exited:
        return False
    if outcome.status in (RunStatus.COMPLETED, RunStatus.WAITING):
        return True
    return outcome.code not in _DESTROYING_CODES
