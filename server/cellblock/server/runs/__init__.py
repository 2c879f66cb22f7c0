"""Runs: input checks, source preparation, legs, output budget, results.

Modules by role: ``_input`` (exec/wait arguments, SPEC §5), ``_source`` (source
preparation, §6), ``_output`` (the host's output budget, §9), ``_result``
(result objects, §10.5), ``_messages`` (exact texts, §14), ``_state`` (a run's
state across legs), ``_leg`` (one cell and its settle loop), ``_runner`` (exec
and wait flows), ``_registry`` (suspended runs and slots).
"""

from cellblock.server.runs import _messages as messages
from cellblock.server.runs._input import InputFailure, ValidatedExec, validate_exec, validate_wait
from cellblock.server.runs._leg import Leg, LegOutcome
from cellblock.server.runs._output import OutputBudget, compact_json, normalize_json
from cellblock.server.runs._ports import LegPorts, ToolOutcome
from cellblock.server.runs._registry import SUSPENDED_RUN_CAP, RunRegistry
from cellblock.server.runs._result import completed_result, failed_result, waiting_result
from cellblock.server.runs._runner import LegReport, Runner
from cellblock.server.runs._source import PreparedSource, prepare_source
from cellblock.server.runs._state import Run

__all__ = [
    "SUSPENDED_RUN_CAP",
    "InputFailure",
    "Leg",
    "LegOutcome",
    "LegPorts",
    "LegReport",
    "OutputBudget",
    "PreparedSource",
    "Run",
    "RunRegistry",
    "Runner",
    "ToolOutcome",
    "ValidatedExec",
    "compact_json",
    "completed_result",
    "failed_result",
    "messages",
    "normalize_json",
    "prepare_source",
    "validate_exec",
    "validate_wait",
    "waiting_result",
]
