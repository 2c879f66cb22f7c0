"""Runs: the run lifecycle across legs.

Modules by role: ``_protocol`` (the run protocol's enums, settlements, resolved calls,
leg events and claim results), ``_state`` (a run's state across legs), ``_ports`` (the
leg's one port and the run's catalog port), ``_policy`` (what the host does with each
bridge request), ``_settle`` (the one settle loop: timers, held-call dispatch, abandon),
``_leg`` (one cell driven by that loop), ``_guest_failure`` (a guest's failure to a
SPEC §11 outcome), ``_runner`` (exec and wait flows), ``_registry`` (this process's runs
over the run store), ``_codec`` (a parked run as a store document), ``_start`` (a leg's
``Start`` with its catalog serialized once per catalog version), ``_output`` (the host's
output budget, SPEC §9) and ``_result`` (result objects, §10.5). Argument checks and
source preparation are ``cellblock.server.source``.
"""

from cellblock.server.runs._large_json import JsonText, PreparedResult, portable, result_in_worker
from cellblock.server.runs._leg import Leg
from cellblock.server.runs._output import OutputBudget, compact_json, normalize_json
from cellblock.server.runs._policy import record_tool_outcome, reply_inbox_bytes
from cellblock.server.runs._ports import CatalogPort, LegPorts
from cellblock.server.runs._protocol import (
    BridgeMethod,
    Cancelled,
    CancelReason,
    CellExited,
    ClaimBusy,
    Claimed,
    ClaimResult,
    ClaimUnknown,
    ErrorCode,
    FailurePhase,
    GuestMessage,
    HostedSettled,
    LegEvent,
    LegOutcome,
    Provenance,
    ResolvedCall,
    RunStatus,
    RuntimeEvent,
    Settlement,
    TimerDue,
    ToolErrorKind,
    ToolOutcome,
)
from cellblock.server.runs._registry import RunRegistry, RunSummary
from cellblock.server.runs._result import completed_result, failed_result, make_telemetry, result_json, waiting_result
from cellblock.server.runs._runner import LegReport, Runner, Telemetry
from cellblock.server.runs._start import join_bytes, start_catalog_part
from cellblock.server.runs._state import PendingRequest, Run

__all__ = [
    "BridgeMethod",
    "CancelReason",
    "Cancelled",
    "CatalogPort",
    "CellExited",
    "ClaimBusy",
    "ClaimResult",
    "ClaimUnknown",
    "Claimed",
    "ErrorCode",
    "FailurePhase",
    "GuestMessage",
    "HostedSettled",
    "JsonText",
    "Leg",
    "LegEvent",
    "LegOutcome",
    "LegPorts",
    "LegReport",
    "OutputBudget",
    "PendingRequest",
    "PreparedResult",
    "Provenance",
    "ResolvedCall",
    "Run",
    "RunRegistry",
    "RunStatus",
    "RunSummary",
    "Runner",
    "RuntimeEvent",
    "Settlement",
    "Telemetry",
    "TimerDue",
    "ToolErrorKind",
    "ToolOutcome",
    "compact_json",
    "completed_result",
    "failed_result",
    "make_telemetry",
    "normalize_json",
    "portable",
    "record_tool_outcome",
    "reply_inbox_bytes",
    "result_in_worker",
    "result_json",
    "join_bytes",
    "start_catalog_part",
    "waiting_result",
]
