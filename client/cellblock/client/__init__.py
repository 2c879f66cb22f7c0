"""Python client of cellblock, the code-mode execution service.

Register a tool catalog for a scope, run model-written programs with `exec`,
serve their nested tool calls with plain async handlers, and resume waiting
runs with `wait`::

    from cellblock.client import CellblockClient, Scope

    async with await CellblockClient.connect("127.0.0.1:50051") as client:
        scope = Scope(session_id="s1", agent_run_id="r1")
        await client.put_catalog(scope, tools)
        result = await client.exec(scope, tool_call_id="call_1", code=src, handlers=handlers)
        print(result.status, result.value)

Errors: see `cellblock.client._errors` for the exception tree.
"""

from cellblock.client._client import CellblockClient
from cellblock.client._errors import (
    CellblockError,
    DeadlineExceededError,
    FailedPreconditionError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    ProtocolError,
    ResourceExhaustedError,
    RPCError,
    ToolErrorKind,
    ToolRefused,
    UnavailableError,
    from_grpc_error,
)
from cellblock.client._legs import OutputCallback, ToolHandler
from cellblock.client._results import (
    BridgeCallCounts,
    LimitOverrides,
    OutputEntry,
    PendingToolCall,
    Run,
    RunMetadata,
    RunPage,
    RunResult,
    SourceCounts,
    Telemetry,
    ToolCallInfo,
)
from cellblock.client._types import (
    Catalog,
    CatalogEntry,
    CatalogPage,
    CatalogSummary,
    CatalogTelemetry,
    DeleteCatalogResult,
    Scope,
    ScopeLike,
    Tool,
    ToolDefinition,
    ToolSurface,
)

__all__ = [
    "BridgeCallCounts",
    "Catalog",
    "CatalogEntry",
    "CatalogPage",
    "CatalogSummary",
    "CatalogTelemetry",
    "CellblockClient",
    "CellblockError",
    "DeadlineExceededError",
    "DeleteCatalogResult",
    "FailedPreconditionError",
    "InternalError",
    "InvalidArgumentError",
    "LimitOverrides",
    "NotFoundError",
    "OutputCallback",
    "OutputEntry",
    "PendingToolCall",
    "PermissionDeniedError",
    "ProtocolError",
    "RPCError",
    "ResourceExhaustedError",
    "Run",
    "RunMetadata",
    "RunPage",
    "RunResult",
    "Scope",
    "ScopeLike",
    "SourceCounts",
    "Telemetry",
    "Tool",
    "ToolCallInfo",
    "ToolDefinition",
    "ToolErrorKind",
    "ToolHandler",
    "ToolRefused",
    "ToolSurface",
    "UnavailableError",
    "from_grpc_error",
]
