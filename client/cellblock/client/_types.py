"""Typed values of the cellblock client: scopes, tools, catalogs, the tool surface.

The dataclasses here and in ``_results`` (exec/wait results and runs) are what users build
and receive; proto messages never leave the client. Field names are snake_case; JSON Schemas
and tool values are plain `dict`/`list` data.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

from cellblock.v1 import (
    catalog_service_pb2,
    code_mode_service_pb2,
    common_pb2,
)

__all__ = [
    "Catalog",
    "CatalogEntry",
    "CatalogPage",
    "CatalogSummary",
    "CatalogTelemetry",
    "DeleteCatalogResult",
    "Scope",
    "ScopeLike",
    "Tool",
    "ToolDefinition",
    "ToolSurface",
]

ToolSourceName = Literal["host", "mcp", "client"]
McpOperationName = Literal["tool", "resources.list", "resources.read", "prompts.list", "prompts.get"]
RunStatusName = Literal["completed", "waiting", "failed"]
RunStateName = Literal["running", "suspended", "unspecified"]

_SOURCE_TO_PROTO: dict[str, common_pb2.ToolSource.ValueType] = {
    "host": common_pb2.TOOL_SOURCE_HOST,
    "mcp": common_pb2.TOOL_SOURCE_MCP,
    "client": common_pb2.TOOL_SOURCE_CLIENT,
}
_SOURCE_FROM_PROTO = {v: k for k, v in _SOURCE_TO_PROTO.items()}

_OPERATION_TO_PROTO: dict[str, catalog_service_pb2.McpOperation.ValueType] = {
    "tool": catalog_service_pb2.MCP_OPERATION_TOOL,
    "resources.list": catalog_service_pb2.MCP_OPERATION_RESOURCES_LIST,
    "resources.read": catalog_service_pb2.MCP_OPERATION_RESOURCES_READ,
    "prompts.list": catalog_service_pb2.MCP_OPERATION_PROMPTS_LIST,
    "prompts.get": catalog_service_pb2.MCP_OPERATION_PROMPTS_GET,
}
_OPERATION_FROM_PROTO = {v: k for k, v in _OPERATION_TO_PROTO.items()}


# ---------------------------------------------------------------------------
# Scope


@dataclass(frozen=True)
class Scope:
    """The owner of catalogs and runs: one agent run inside one session."""

    session_id: str
    """The runtime's session id; non-empty, at most 256 characters."""
    agent_run_id: str
    """The runtime's agent-run id inside the session; non-empty, at most 256 characters."""

    def _to_proto(self) -> common_pb2.Scope:
        return common_pb2.Scope(session_id=self.session_id, agent_run_id=self.agent_run_id)

    @classmethod
    def _from_proto(cls, msg: common_pb2.Scope) -> Scope:
        return cls(session_id=msg.session_id, agent_run_id=msg.agent_run_id)


ScopeLike: TypeAlias = Scope | tuple[str, str]
"""A `Scope`, or a ``(session_id, agent_run_id)`` pair."""


def _scope(value: ScopeLike) -> Scope:
    if isinstance(value, Scope):
        return value
    if isinstance(value, tuple) and len(value) == 2:
        return Scope(session_id=value[0], agent_run_id=value[1])
    raise TypeError(f"scope must be a Scope or a (session_id, agent_run_id) tuple, not {type(value).__name__}")


# ---------------------------------------------------------------------------
# Catalog


def _json_or_none(text: str) -> Any:
    return json.loads(text) if text else None


@dataclass(frozen=True)
class Tool:
    """One tool as the runtime registers it (SPEC §3.2).

    `Tool.from_dict` accepts the SPEC's camelCase registration shape
    (``outputSchema``, ``replaySafe``, ...), which is also the shape of
    ``examples/catalog.json``.
    """

    source: ToolSourceName
    """Where the tool comes from: ``"host"`` (trusted), ``"mcp"`` or ``"client"``."""
    name: str
    """The tool name; for ``mcp``, the MCP tool's own name."""
    owner: str = ""
    """The owner part of the id; empty means ``core`` (host) or ``client`` (client). Required for mcp."""
    label: str = ""
    """Optional display label."""
    description: str = ""
    """Optional description."""
    parameters: Mapping[str, Any] | None = None
    """JSON Schema of the input, or ``None`` for none."""
    output_schema: Mapping[str, Any] | None = None
    """JSON Schema of the result's ``details``; honoured for host tools only."""
    replay_safe: bool = False
    """Host only: calls may be replayed after a service restart."""
    side_effecting: bool = False
    """Host only: the tool changes the world and is never replay-safe."""
    direct_only: bool = False
    """Model-visible as a direct tool, never in the catalog."""
    operation: McpOperationName = "tool"
    """MCP only: the MCP operation the tool stands for."""

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Tool:
        """Builds a tool from the SPEC §3.2 registration shape.

        Args:
            data: A mapping with ``source`` and ``name`` and optionally
                ``owner``, ``label``, ``description``, ``parameters``,
                ``outputSchema``, ``replaySafe``, ``sideEffecting``,
                ``directOnly`` and ``operation``. snake_case keys are accepted too.

        Returns:
            The tool.

        Raises:
            ValueError: If ``source`` or ``name`` is missing, or a key is unknown.
        """
        aliases = {
            "outputSchema": "output_schema",
            "replaySafe": "replay_safe",
            "sideEffecting": "side_effecting",
            "directOnly": "direct_only",
        }
        known = {f.name for f in dataclasses.fields(cls)}
        kwargs: dict[str, Any] = {}
        for key, value in data.items():
            name = aliases.get(key, key)
            if name not in known:
                raise ValueError(f"unknown tool field {key!r} in tool {data.get('name')!r}")
            kwargs[name] = value
        if "source" not in kwargs or "name" not in kwargs:
            raise ValueError(f"a tool needs 'source' and 'name', got keys {sorted(data)}")
        return cls(**kwargs)

    def to_dict(self) -> dict[str, Any]:
        """Returns the SPEC §3.2 camelCase registration shape, leaving defaults out."""
        out: dict[str, Any] = {"source": self.source, "name": self.name}
        if self.owner:
            out["owner"] = self.owner
        if self.label:
            out["label"] = self.label
        if self.description:
            out["description"] = self.description
        if self.parameters is not None:
            out["parameters"] = self.parameters
        if self.output_schema is not None:
            out["outputSchema"] = self.output_schema
        for key, value in (
            ("replaySafe", self.replay_safe),
            ("sideEffecting", self.side_effecting),
            ("directOnly", self.direct_only),
        ):
            if value:
                out[key] = True
        if self.source == "mcp" and self.operation != "tool":
            out["operation"] = self.operation
        return out

    def _to_proto(self) -> catalog_service_pb2.Tool:
        if self.source not in _SOURCE_TO_PROTO:
            raise ValueError(f"tool {self.name!r}: source must be host, mcp or client, not {self.source!r}")
        if self.operation not in _OPERATION_TO_PROTO:
            raise ValueError(f"tool {self.name!r}: unknown MCP operation {self.operation!r}")
        return catalog_service_pb2.Tool(
            source=_SOURCE_TO_PROTO[self.source],
            owner=self.owner,
            name=self.name,
            label=self.label,
            description=self.description,
            parameters_json=_schema_text(self.name, "parameters", self.parameters),
            output_schema_json=_schema_text(self.name, "output_schema", self.output_schema),
            replay_safe=self.replay_safe,
            side_effecting=self.side_effecting,
            direct_only=self.direct_only,
            operation=_OPERATION_TO_PROTO[self.operation] if self.source == "mcp" else catalog_service_pb2.MCP_OPERATION_UNSPECIFIED,
        )

    @classmethod
    def _from_proto(cls, msg: catalog_service_pb2.Tool) -> Tool:
        source: Any = _SOURCE_FROM_PROTO.get(msg.source, "unspecified")
        operation: Any = _OPERATION_FROM_PROTO.get(msg.operation, "tool")
        return cls(
            source=source,
            name=msg.name,
            owner=msg.owner,
            label=msg.label,
            description=msg.description,
            parameters=_json_or_none(msg.parameters_json),
            output_schema=_json_or_none(msg.output_schema_json),
            replay_safe=msg.replay_safe,
            side_effecting=msg.side_effecting,
            direct_only=msg.direct_only,
            operation=operation,
        )


@dataclass(frozen=True)
class CatalogTelemetry:
    """Sizes and cumulative counters of a catalog session."""

    catalog_size: int
    """Entries in the catalog, all sources together."""
    host_count: int
    """Entries whose source is ``host``."""
    mcp_count: int
    """Entries whose source is ``mcp``."""
    client_count: int
    """Entries whose source is ``client``."""
    search_count: int
    """Cumulative ``tools.search`` requests of the catalog session."""
    describe_count: int
    """Cumulative ``tools.describe`` requests of the catalog session."""
    call_count: int
    """Cumulative nested call requests of the catalog session."""
    counter_scope: str
    """12 lower-case hex digits naming the counter lifetime; new on every replace."""

    @classmethod
    def _from_proto(cls, msg: common_pb2.CatalogTelemetry) -> CatalogTelemetry:
        return cls(
            catalog_size=msg.catalog_size,
            host_count=msg.host_count,
            mcp_count=msg.mcp_count,
            client_count=msg.client_count,
            search_count=msg.search_count,
            describe_count=msg.describe_count,
            call_count=msg.call_count,
            counter_scope=msg.counter_scope,
        )


@dataclass(frozen=True)
class CatalogEntry:
    """One registered catalog entry."""

    id: str
    """``<source>:<owner>:<name>``, e.g. ``host:shipping:shipping_list``. Opaque."""
    tool: Tool
    """The registered tool, normalised by the service (owner trimmed, defaults filled in)."""


@dataclass(frozen=True)
class Catalog:
    """A scope's catalog session as the service holds it."""

    scope: Scope
    """The owning scope."""
    entries: list[CatalogEntry]
    """Entries after exclusions and policy, sorted by id."""
    telemetry: CatalogTelemetry
    """Counters and sizes."""
    direct_tool_names: list[str]
    """Names of the tools shown next to ``exec``/``wait``."""

    @property
    def ids(self) -> list[str]:
        """The entry ids, sorted."""
        return [e.id for e in self.entries]

    def get(self, tool_id: str) -> Tool | None:
        """Returns the tool registered under ``tool_id``, or ``None``."""
        for entry in self.entries:
            if entry.id == tool_id:
                return entry.tool
        return None

    @classmethod
    def _from_proto(cls, msg: catalog_service_pb2.Catalog) -> Catalog:
        return cls(
            scope=Scope._from_proto(msg.scope),
            entries=[CatalogEntry(id=e.id, tool=Tool._from_proto(e.tool)) for e in msg.entries],
            telemetry=CatalogTelemetry._from_proto(msg.telemetry),
            direct_tool_names=list(msg.direct_tool_names),
        )


@dataclass(frozen=True)
class CatalogSummary:
    """One catalog of a session, without its entries."""

    scope: Scope
    """The owning scope."""
    telemetry: CatalogTelemetry
    """Sizes and counters."""


@dataclass(frozen=True)
class CatalogPage:
    """One page of `CellblockClient.list_catalogs`."""

    catalogs: list[CatalogSummary]
    """The catalogs of this page, ordered by agent run id."""
    next_page_token: str
    """Token for the next page; empty on the last page."""


@dataclass(frozen=True)
class DeleteCatalogResult:
    """What ending a scope stopped."""

    aborted_legs: int
    """Legs that were running and ended as ``aborted``."""
    discarded_runs: int
    """Suspended runs that were discarded."""


# ---------------------------------------------------------------------------
# Tool surface


@dataclass(frozen=True)
class ToolDefinition:
    """One model-visible tool definition."""

    name: str
    """The tool name shown to the model, e.g. ``exec``."""
    description: str
    """The description shown to the model."""
    parameters: dict[str, Any]
    """The JSON Schema of the tool's parameters."""


@dataclass(frozen=True)
class ToolSurface:
    """The model-visible tools of a scope for one model (SPEC §3.3)."""

    code_mode_engaged: bool
    """Whether code mode is engaged for the model."""
    tools: list[ToolDefinition]
    """The model-visible tools, in order."""

    @classmethod
    def _from_proto(cls, msg: code_mode_service_pb2.GetToolSurfaceResponse) -> ToolSurface:
        return cls(
            code_mode_engaged=msg.code_mode_engaged,
            tools=[
                ToolDefinition(
                    name=t.name,
                    description=t.description,
                    parameters=json.loads(t.parameters_json) if t.parameters_json else {},
                )
                for t in msg.tools
            ],
        )


def _tools_to_proto(tools: Sequence[Tool | Mapping[str, Any]]) -> list[catalog_service_pb2.Tool]:
    out = []
    for index, item in enumerate(tools):
        tool = item if isinstance(item, Tool) else Tool.from_dict(item)
        try:
            out.append(tool._to_proto())
        except ValueError as exc:
            raise ValueError(f"tools[{index}]: {exc}") from None
    return out


def _schema_text(tool: str, field: str, schema: Any) -> str:
    """A tool's schema as compact JSON text ("" for none).

    Raises:
        ValueError: The schema nests too deeply for Python's JSON encoder (its
            recursion limit, about 1000 levels; the service refuses more than 128).
        TypeError: A value that is not JSON-serialisable.
    """
    if schema is None:
        return ""
    try:
        return json.dumps(schema, separators=(",", ":"))
    except RecursionError:
        raise ValueError(f"tool {tool!r}: {field} nests too deeply to encode as JSON (the service accepts at most 128 levels)") from None
