"""Runs: the run lifecycle across legs.

Modules by role: ``_output`` (the host's output budget, SPEC §9), ``_result``
(result objects, §10.5), ``_state`` (a run's state across legs), ``_leg`` (one cell
and its settle loop), ``_runner`` (exec and wait flows), ``_registry`` (suspended
runs and slots). Argument checks and source preparation are ``cellblock.server.source``.
"""

from cellblock.server.runs._leg import Leg, LegOutcome
from cellblock.server.runs._output import OutputBudget, compact_json, normalize_json
from cellblock.server.runs._ports import LegPorts, ToolOutcome
from cellblock.server.runs._registry import SUSPENDED_RUN_CAP, RunRegistry
from cellblock.server.runs._result import completed_result, failed_result, waiting_result
from cellblock.server.runs._runner import LegReport, Runner
from cellblock.server.runs._state import Run

__all__ = [
    "SUSPENDED_RUN_CAP",
    "Leg",
    "LegOutcome",
    "LegPorts",
    "LegReport",
    "OutputBudget",
    "Run",
    "RunRegistry",
    "Runner",
    "ToolOutcome",
    "compact_json",
    "completed_result",
    "failed_result",
    "normalize_json",
    "waiting_result",
]
