"""Span and metric attribute keys of cellblock (DESIGN.md §5).

Standard keys are imported from ``opentelemetry.semconv`` (docs/DESIGN.md §5);
the rest live under the ``cellblock.`` namespace. Values never carry source
text, tool inputs or outputs, secrets or environment values (SPEC §12 item 4).
"""

from __future__ import annotations

from opentelemetry.semconv.attributes.container_attributes import CONTAINER_ID, CONTAINER_IMAGE_NAME
from opentelemetry.semconv.attributes.error_attributes import ERROR_TYPE

__all__ = [
    "AGENT_RUN_ID",
    "BRIDGE_ID",
    "BRIDGE_METHOD",
    "CATALOG_SIZE",
    "CELL_ID",
    "CONTAINER_ID",
    "CONTAINER_IMAGE_NAME",
    "ERROR_TYPE",
    "EXECUTOR",
    "LEG",
    "NESTED_CALL_ID",
    "RESUME_MS",
    "RPC_KIND",
    "RUN_ID",
    "RUN_STATUS",
    "SESSION_ID",
    "SNAPSHOT_BYTES",
    "SNAPSHOT_RAW_BYTES",
    "TOOL_CALL_DURATION_MS",
    "TOOL_CALL_ID",
    "TOOL_CALL_STATUS",
    "TOOL_ID",
    "TOOL_SOURCE",
]

#: The run id (``run_`` plus 32 hex digits).
RUN_ID = "cellblock.run.id"
#: The scope's session id.
SESSION_ID = "cellblock.session.id"
#: The scope's agent-run id.
AGENT_RUN_ID = "cellblock.agent_run.id"
#: The exec's model tool-call id.
TOOL_CALL_ID = "cellblock.tool_call.id"
#: ``exec`` or ``wait``.
RPC_KIND = "cellblock.rpc.kind"
#: The cell id (``cell_`` plus 16 hex digits).
CELL_ID = "cellblock.cell.id"
#: The executor that ran the cell (``docker``, ``process``).
EXECUTOR = "cellblock.executor"
#: The 1-based leg number of the run.
LEG = "cellblock.run.leg"
#: Entries in the run's catalog view.
CATALOG_SIZE = "cellblock.catalog.size"
#: ``completed``, ``waiting`` or ``failed``.
RUN_STATUS = "cellblock.run.status"
#: Compressed snapshot size in bytes.
SNAPSHOT_BYTES = "cellblock.snapshot.bytes"
#: Uncompressed VM image size in bytes.
SNAPSHOT_RAW_BYTES = "cellblock.snapshot.raw_bytes"
#: Milliseconds from sending a snapshot to the restored guest's first message.
RESUME_MS = "cellblock.resume.duration_ms"
#: The nested call's catalog id, e.g. ``host:orders.list``.
TOOL_ID = "cellblock.tool.id"
#: ``host``, ``mcp`` or ``client``.
TOOL_SOURCE = "cellblock.tool.source"
#: ``ok``, ``error``, ``rejected`` or ``abandoned``.
TOOL_CALL_STATUS = "cellblock.tool_call.status"
#: Milliseconds from dispatch to the runtime's answer.
TOOL_CALL_DURATION_MS = "cellblock.tool_call.duration_ms"
#: ``cellblock_<P>_<R>_<n>``.
NESTED_CALL_ID = "cellblock.nested_call.id"
#: ``bridge:<method>:<n>``.
BRIDGE_ID = "cellblock.bridge.id"
#: ``search``, ``describe`` or ``call``.
BRIDGE_METHOD = "cellblock.bridge.method"
