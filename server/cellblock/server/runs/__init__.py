"""Runs: the run lifecycle across legs.

Modules by role: ``_output`` (the host's output budget, SPEC §9), ``_result``
(result objects, §10.5), ``_state`` (a run's state across legs), ``_leg`` (one cell
and its settle loop), ``_runner`` (exec and wait flows), ``_registry`` (suspended
runs and slots). Argument checks and source preparation are ``cellblock.server.source``.
"""

from cellblock.server.runs._leg import Leg, LegOutcome
from cellblock.server.runs._output import OutputBudget, compact_json, normalize_json
from cellblock.server.runs._ports import LegPorts, ToolOutcome
from cellblock.server.runs._registry import RunRegistry
from cellblock.server.runs._result import completed_result, failed_result, make_telemetry, waiting_result
from cellblock.server.runs._runner import LegReport, Runner
from cellblock.server.runs._state import PendingRequest, Run

__all__ = [
    "Leg",
    "LegOutcome",
    "LegPorts",
    "LegReport",
    "OutputBudget",
    "PendingRequest",
    "Run",
    "RunRegistry",
    "Runner",
    "ToolOutcome",
    "compact_json",
    "completed_result",
    "failed_result",
    "make_telemetry",
    "normalize_json",
    "waiting_result",
]
