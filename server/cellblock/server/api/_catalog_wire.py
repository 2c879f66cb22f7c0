"""A registration's processing and its answer's wire form, built in a worker process (SPEC §3.1 item 6, §2.3).

A trusted registration of 21 MB held the shared event loop 120-450 ms: the loop built the
answer's ``CatalogEntry`` messages (every description and schema text copied into protobuf,
about 100 ms), gRPC serialized them again, and the loop sent the decoded entries back to a
worker to build the catalog view's guest data. Here one worker call does all of it for a
registration into a new catalog session: schema decoding and checks
(``catalog.registration_problem``), the view's ``MCP`` namespace, ``Start`` catalog part,
search model and stored entries (``_catalogs.start_data``), and each registered entry's
serialized ``CatalogEntry``. The loop keeps those bytes with the catalog version and answers
``PutCatalog``/``GetCatalog`` by concatenating them (a repeated field's entries concatenate
on the wire), joined in a thread when large (``bytes.join`` copies without the GIL).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from google.protobuf.message import Message

from cellblock.server.api._catalogs import ScopeCatalog, StartData, start_data
from cellblock.server.catalog import SCHEMA_FIELDS, CatalogEntry, CatalogRegistrationError, Problem, SchemaTexts, checked_registration, compact_json
from cellblock.server.runs import join_bytes
from cellblock.v1 import catalog_service_pb2 as pb
from cellblock.v1 import common_pb2

__all__ = ["EntryWire", "catalog_response", "check_hosted", "entry_message", "register_in_worker", "serialized", "tool_to_dict"]

_SOURCES = {common_pb2.TOOL_SOURCE_HOST: "host", common_pb2.TOOL_SOURCE_MCP: "mcp", common_pb2.TOOL_SOURCE_CLIENT: "client"}
_OPERATIONS = {
    pb.MCP_OPERATION_TOOL: "tool",
    pb.MCP_OPERATION_RESOURCES_LIST: "resources.list",
    pb.MCP_OPERATION_RESOURCES_READ: "resources.read",
    pb.MCP_OPERATION_PROMPTS_LIST: "prompts.list",
    pb.MCP_OPERATION_PROMPTS_GET: "prompts.get",
}
_SOURCE_ENUM = {v: k for k, v in _SOURCES.items()}
_OPERATION_ENUM = {v: k for k, v in _OPERATIONS.items()}


def tool_to_dict(tool: pb.Tool) -> dict[str, Any]:
    """Converts a proto Tool to the registration shape of SPEC §3.2, its schemas still JSON text.

    The schemas stay under their proto field names (``parameters_json``,
    ``output_schema_json``) for the worker to decode (``catalog.decode_schemas``): decoding
    megabytes on the event loop held it for 15-60 ms (SPEC §3.1 item 6).
    """
    out: dict[str, Any] = {"source": _SOURCES.get(tool.source), "name": tool.name}
    if tool.owner:
        out["owner"] = tool.owner
    if tool.label:
        out["label"] = tool.label
    if tool.description:
        out["description"] = tool.description
    for field, _key in SCHEMA_FIELDS:
        text = getattr(tool, field)
        if text:
            out[field] = text
    if tool.replay_safe:
        out["replaySafe"] = True
    if tool.side_effecting:
        out["sideEffecting"] = True
    if tool.direct_only:
        out["directOnly"] = True
    if tool.operation in _OPERATIONS:
        out["operation"] = _OPERATIONS[tool.operation]
    return out


def check_hosted(tools: list[dict[str, Any]], hosted: list[dict[str, Any]]) -> None:
    """Refuses a caller's ``mcp`` tool under the name of a server this service hosts (SPEC §3.2 item 7).

    Args:
        tools: The caller's tools (:func:`tool_to_dict`).
        hosted: The hosted MCP servers' entries.

    Raises:
        CatalogRegistrationError: The caller registers an ``mcp`` tool under the
            name of a server cellblock hosts itself; calls to that server go to
            the hosted server, so the caller's copy would describe another tool.
    """
    servers = {t["owner"] for t in hosted}
    for index, tool in enumerate(tools):
        owner = tool.get("owner")
        if tool.get("source") == "mcp" and isinstance(owner, str) and owner.strip() in servers:
            name = tool.get("name")
            label = f"mcp:{owner.strip()}:{name}" if isinstance(name, str) and name.strip() else None
            raise CatalogRegistrationError(index, f"owner {owner.strip()!r} is an MCP server hosted by this cellblock service; its tools join every catalog by themselves", label)


EntryWire = dict[str, bytes]
"""Per catalog id, the entry as one serialized ``Catalog.entries`` field (tag, length, ``CatalogEntry``)."""


def entry_message(entry: CatalogEntry, texts: tuple[str, str] | None) -> pb.CatalogEntry:
    """An entry as the ``Catalog`` answer lists it (the registered tool, normalised).

    Args:
        entry: The registered entry.
        texts: The compact JSON of its ``parameters`` and ``outputSchema`` (``""`` when absent),
            or ``None`` to write them here.
    """
    if texts is None:
        texts = (compact_json(entry.parameters) if entry.parameters is not None else "", compact_json(entry.output_schema) if entry.output_schema is not None else "")
    tool = pb.Tool(
        source=_SOURCE_ENUM[entry.source],
        owner=entry.owner,
        name=entry.name,
        label=entry.label or "",
        description=entry.description,
        parameters_json=texts[0],
        output_schema_json=texts[1],
        replay_safe=entry.replay_safe,
        side_effecting=entry.side_effecting,
        operation=_OPERATION_ENUM.get(entry.operation or "", pb.MCP_OPERATION_UNSPECIFIED),
    )
    return pb.CatalogEntry(id=entry.id, tool=tool)


def _entry_wire(entries: Sequence[CatalogEntry], texts: SchemaTexts) -> EntryWire:
    return {e.id: pb.Catalog(entries=[entry_message(e, texts.get(e.id))]).SerializeToString() for e in entries}


def register_in_worker(
    data: bytes, hosted: list[dict[str, Any]], fresh: bool, direct: list[str], allow: list[str] | None, deny: list[str] | None
) -> tuple[Problem | None, SchemaTexts, list[dict[str, Any]], EntryWire, StartData | None]:
    """Worker side of ``PutCatalog``: reads the tools, checks the registration, builds what the loop serves it from.

    Args:
        data: The ``PutCatalogRequest``'s wire bytes (its tools are read here, never on the loop).
        hosted: The hosted MCP servers' entries (SPEC §3.2 item 7).
        fresh: A registration into a new catalog session: the hosted entries join it (after the
            caller's tools, so registration errors keep the caller's indexes) and its view's start
            data is built (a merge's view includes the session's earlier entries).
        direct: ``directToolNames``.
        allow: ``allow``, or ``None``.
        deny: ``deny``, or ``None``.

    Returns:
        ``(problem, texts, tools, wire, start)``: as ``registration_problem`` for the first three;
        ``wire`` holds every registered entry's serialized ``CatalogEntry``; ``start`` the view's
        ``_catalogs.start_data`` (``None`` unless ``fresh``, or when refused).
    """
    tools = [tool_to_dict(t) for t in pb.PutCatalogRequest.FromString(data).tools]
    try:
        check_hosted(tools, hosted)
    except CatalogRegistrationError as error:
        return (error.index, error.problem, error.tool), {}, [], {}, None
    if fresh:
        tools += hosted
    prepare = fresh
    problem, texts, decoded, catalog = checked_registration(tools, "replace", direct, allow, deny)
    if problem is not None or catalog is None:
        return problem, texts, decoded, {}, None
    view = catalog.view
    start = start_data(view.entries, view.all_tools(), view.convenience_names()) if prepare else None
    return None, texts, decoded, _entry_wire(catalog.registered_entries(), texts), start


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field_parts(scope: tuple[str, str], catalog: ScopeCatalog, telemetry: common_pb2.CatalogTelemetry) -> list[bytes]:
    view = catalog.catalog.view
    head = pb.Catalog(scope=common_pb2.Scope(session_id=scope[0], agent_run_id=scope[1]), telemetry=telemetry, direct_tool_names=[t["name"] for t in view.direct_tools()])
    parts = [head.SerializeToString()]
    wire: Mapping[str, bytes] = catalog.entry_wire
    for entry in view.entries:
        part = wire.get(entry.id)
        parts.append(part if part is not None else pb.Catalog(entries=[entry_message(entry, catalog.schema_texts.get(entry.id))]).SerializeToString())
    return parts


async def catalog_response(scope: tuple[str, str], catalog: ScopeCatalog, telemetry: common_pb2.CatalogTelemetry) -> bytes:
    """The serialized ``PutCatalogResponse``/``GetCatalogResponse`` of a scope's catalog (both are ``{1: Catalog}``).

    Put together from the entries' kept wire forms; joined in a thread when over 1 MB (``runs.join_bytes``).
    """
    parts = _field_parts(scope, catalog, telemetry)
    size = sum(len(p) for p in parts)
    parts[:0] = [b"\x0a", _varint(size)]  # field 1 (catalog), length-delimited
    return await join_bytes(parts)


def serialized(message: Message | bytes) -> bytes:
    """A response's wire form; ``bytes`` are one already serialized."""
    return message if isinstance(message, bytes) else message.SerializeToString()
