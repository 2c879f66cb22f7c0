"""The guest's output messages on the host: entries offered to the run's budget, omissions recorded (SPEC §9)."""

from __future__ import annotations

import json
from typing import Any

from structlog.typing import FilteringBoundLogger

from cellblock.bridge.v1 import bridge_service_pb2 as bpb
from cellblock.server.catalog import strict_json
from cellblock.server.limits import MAX_VALUE_DEPTH
from cellblock.server.runs._output import NotSerializableError, is_output_entry
from cellblock.server.runs._state import Run


def accepted_entry(run: Run, entry_json: str, log: FilteringBoundLogger) -> dict[str, Any] | None:
    """Reads one output entry the guest sent and offers it to the run's output budget.

    An entry that is not JSON, not a text/json entry, or nested deeper than the value
    bound is dropped and logged (SPEC §8.4 item 6).

    Args:
        run: The run whose budget takes the entry.
        entry_json: The entry as the guest sent it (JSON text of one object).
        log: The leg's bound logger.

    Returns:
        The accepted entry, or ``None`` when it was dropped or the budget refused it.
    """
    try:
        entry = strict_json(entry_json, MAX_VALUE_DEPTH + 1)  # the entry object holds the value
    except RecursionError:
        log.warning("bridge.output_too_deep")
        return None
    except ValueError:
        entry = None
    if not is_output_entry(entry):  # not JSON, or not a text/json entry
        log.error("bridge.invalid_output")
        return None
    try:
        accepted = run.budget.offer(entry)
    except NotSerializableError:
        log.warning("bridge.output_too_deep")
        return None
    return entry if accepted else None


def record_omission(run: Run, omission: bpb.OutputOmission) -> None:
    """Records entries the cell's controller omitted (SPEC §9 rule 11), as they are reported."""
    try:
        first = json.loads(omission.first_omitted_content or '""')
    except (ValueError, RecursionError):
        first = ""
    run.budget.record_omitted(max(0, omission.omitted_entries), max(0, omission.omitted_bytes), first if isinstance(first, str) else "")
