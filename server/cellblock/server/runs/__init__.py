"""Runs: input checks, source preparation, legs, output budget, results."""

from cellblock.server.runs._leg import Leg, LegOutcome
from cellblock.server.runs._ports import LegPorts, ToolOutcome
from cellblock.server.runs._registry import SUSPENDED_RUN_CAP, RunRegistry
from cellblock.server.runs._runner import LegReport, Runner
from cellblock.server.runs._state import Run

__all__ = [
    "SUSPENDED_RUN_CAP",
    "Leg",
    "LegOutcome",
    "LegPorts",
    "LegReport",
    "Run",
    "RunRegistry",
    "Runner",
    "ToolOutcome",
]
