"""Observability of cellblock: traces, metrics, RPC interceptors (DESIGN.md §5).

Library code imports from here and uses the OpenTelemetry API only; the SDK
is wired by the entry points through :mod:`cellblock.server.telemetry.sdk`
(``configure_telemetry``). ``python -m cellblock.server.telemetry.trace``
prints a run's span tree from a JSON-lines span file.
"""

from cellblock.server.telemetry._interceptors import server_interceptors
from cellblock.server.telemetry._loop import LoopMonitor
from cellblock.server.telemetry._metrics import observe_registry, record_bridge_call
from cellblock.server.telemetry._spans import (
    LegTrace,
    annotate_rpc,
    current_trace_id,
    end_open_tool_calls,
    end_tool_call,
    remember_exec_span,
    start_tool_call,
)

__all__ = [
    "LegTrace",
    "LoopMonitor",
    "annotate_rpc",
    "current_trace_id",
    "end_open_tool_calls",
    "end_tool_call",
    "observe_registry",
    "record_bridge_call",
    "remember_exec_span",
    "server_interceptors",
    "start_tool_call",
]
