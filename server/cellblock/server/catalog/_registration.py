"""Validation of registered tools (SPEC §3.2 item 2-4, §7.1 items 1-3)."""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

from cellblock.server import messages as msg
from cellblock.server.limits import MAX_CATALOG_ID_CHARS, MAX_TOOL_IDENTIFIER_CHARS, MAX_TOOLS_PER_REQUEST

from ._bounded import schema_problem
from ._contracts import compile_schema
from ._entries import MCP_OPERATIONS, CatalogEntry, McpOperation, Source
from ._errors import CatalogRegistrationError
from ._hints import input_hint, output_hint
from ._text import deep_copy, js_trim

__all__ = ["CONTROL_TOOL_NAMES", "Mode", "ParsedTools", "RegisteredTool", "parse_mode", "parse_name_list", "parse_tools"]

Mode: TypeAlias = Literal["replace", "merge"]

CONTROL_TOOL_NAMES: frozenset[str] = frozenset({"tool_search_code", "tool_search", "tool_describe", "tool_call"})
"""Names of catalog controls of other designs; such tools are never catalogued."""

_DEFAULT_OWNERS: dict[str, str] = {"host": "core", "client": "client"}


class _ToolProblemError(Exception):
    """One tool's registration problem, reported with the tool's index."""


@dataclass(frozen=True)
class RegisteredTool:
    """One validated tool of a registration."""

    index: int
    """Position in its registration."""
    raw: Mapping[str, Any]
    """A private deep copy of the registered tool, as given."""
    entry: CatalogEntry
    """The entry the tool becomes when it is catalogued."""
    direct_only: bool
    """``directOnly`` as registered."""
    ignored: tuple[str, ...] = ()
    """Registered fields ignored for this source (``outputSchema`` of ``mcp``/``client``
    tools); the caller logs them."""


def _optional_bool(tool: Mapping[str, Any], key: str) -> bool:
    value = tool.get(key)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise _ToolProblemError(f"{key} must be a boolean")
    return value


def _optional_string(tool: Mapping[str, Any], key: str) -> str | None:
    value = tool.get(key)
    if value is not None and not isinstance(value, str):
        raise _ToolProblemError(f"{key} must be a string")
    return value


def _short(field: str, value: str) -> str:
    """Returns ``value``, or refuses a tool identifier longer than its cap ([C03])."""
    if len(value) > MAX_TOOL_IDENTIFIER_CHARS:
        raise _ToolProblemError(msg.c03(field, MAX_TOOL_IDENTIFIER_CHARS))
    return value


def _owner(tool: Mapping[str, Any], source: str) -> str:
    value = tool.get("owner")
    if value is None:
        if source == "mcp":
            raise _ToolProblemError("owner (the MCP server name) is required for mcp tools")
        return _DEFAULT_OWNERS[source]
    if not isinstance(value, str):
        raise _ToolProblemError("owner must be a string")
    owner = _short("owner", js_trim(value))
    if not owner:
        raise _ToolProblemError("owner must not be empty")
    if ":" in owner or any(ch.isspace() for ch in owner):
        raise _ToolProblemError("owner must not contain ':' or whitespace")
    return owner


def _name(tool: Mapping[str, Any]) -> str:
    name = tool.get("name")
    if not isinstance(name, str) or not name:
        raise _ToolProblemError("name is required and must be a non-empty string")
    _short("name", name)
    if any(unicodedata.category(ch) == "Cc" for ch in name):
        raise _ToolProblemError("name must not contain control characters")
    return name


def _parse_tool(index: int, tool: object, check: bool = True, copy: bool = True) -> RegisteredTool:
    if not isinstance(tool, Mapping):
        raise _ToolProblemError("tool must be an object")
    source = tool.get("source")
    if source not in ("host", "mcp", "client") or not isinstance(source, str):
        raise _ToolProblemError("source is required and must be host, mcp or client")
    typed_source: Source = source  # type: ignore[assignment]
    owner = _owner(tool, source)
    name = _name(tool)
    label = _optional_string(tool, "label")
    if label is not None:
        _short("label", label)
    description = _optional_string(tool, "description") or ""
    replay_safe = _optional_bool(tool, "replaySafe")
    side_effecting = _optional_bool(tool, "sideEffecting")
    direct_only = _optional_bool(tool, "directOnly")
    operation_raw = tool.get("operation")
    operation: McpOperation | None = None
    if source == "mcp":
        if operation_raw is None:
            operation = "tool"
        elif isinstance(operation_raw, str) and operation_raw in MCP_OPERATIONS:
            operation = operation_raw
        else:
            raise _ToolProblemError("operation must be one of " + ", ".join(MCP_OPERATIONS))
    elif operation_raw is not None:
        raise _ToolProblemError("operation is only allowed for mcp tools")
    if check:
        for key in ("parameters", "outputSchema"):
            problem = schema_problem(tool.get(key), patterns=False)
            if problem is not None:
                raise _ToolProblemError(f"{key} is not a valid JSON Schema: {problem}")
    # One copy of the caller's data (megabytes of schema cost ~10 ms per MB each, on the
    # shared loop): the entry's schemas are the raw copy's, both read-only from here on.
    raw = deep_copy(dict(tool)) if copy else dict(tool)
    parameters = raw.get("parameters")
    output_schema = raw.get("outputSchema")
    entry_id = f"{source}:{owner}:{name}"
    if source == "host":
        entry = CatalogEntry(
            id=entry_id,
            source="host",
            owner=owner,
            name=name,
            label=label,
            description=description,
            parameters=parameters,
            output_schema=output_schema,
            replay_safe=replay_safe,
            side_effecting=side_effecting,
            input_hint=input_hint(parameters),
            output_hint=output_hint(output_schema),
            input_validator=None if parameters is None else compile_schema(parameters, "parameters", check=check),
            output_validator=None if output_schema is None else compile_schema(output_schema, "outputSchema", check=check),
        )
    else:
        entry = CatalogEntry(
            id=entry_id,
            source=typed_source,
            owner=owner,
            name=name,
            label=label,
            description=description,
            parameters=parameters,
            operation=operation,
        )
    ignored = ("outputSchema",) if source != "host" and output_schema is not None else ()
    return RegisteredTool(
        index=index, raw=raw, entry=entry, direct_only=direct_only, ignored=ignored
    )


def _tool_label(tool: object) -> str | None:
    """Names an invalid tool in its error (SPEC §3.2 item 4).

    Returns:
        Its id when source, owner and name are valid, else its name as a JSON
        string when that is a string, else ``None``.
    """
    if not isinstance(tool, Mapping):
        return None
    try:
        name = _name(tool)
    except _ToolProblemError:
        raw = tool.get("name")
        return json.dumps(raw[:200], ensure_ascii=False) if isinstance(raw, str) and raw.strip() else None
    source = tool.get("source")
    if isinstance(source, str) and source in ("host", "mcp", "client"):
        try:
            return f"{source}:{_owner(tool, source)}:{name}"
        except _ToolProblemError:
            pass
    return json.dumps(name[:200], ensure_ascii=False)


class ParsedTools(list[RegisteredTool]):
    """Tools :func:`parse_tools` validated (in slices, e.g.); :meth:`Catalog.register` takes them as they are."""


def parse_tools(
    tools: object, *, check_schemas: bool = True, copy: bool = True, first: int = 0, seen: dict[str, int] | None = None
) -> list[RegisteredTool]:
    """Validates every tool of a registration (SPEC §3.2 items 2-4).

    Args:
        tools: The registered tools: a list of JSON objects with the keys of SPEC §3.2
            (``source``, ``owner``, ``name``, ``label``, ``description``, ``parameters``,
            ``outputSchema``, ``replaySafe``, ``sideEffecting``, ``directOnly``,
            ``operation``). Absent and ``None`` values are the same; other keys are ignored.
        check_schemas: Check ``host`` schemas against their metaschemas; ``False`` only
            when a worker process already parsed the same tools (:func:`checked_in_worker`).
        copy: Keep a deep copy of each tool; ``False`` keeps the given data (the caller
            hands it over and never mutates it).
        first: The index of ``tools[0]`` in its registration (a slice of a registration).
        seen: The ids of the registration's earlier slices by index (updated here), or ``None``.

    Returns:
        The validated tools, in registration order.

    Raises:
        CatalogRegistrationError: The first invalid tool or duplicate id, by index.
    """
    if not isinstance(tools, Sequence) or isinstance(tools, (str, bytes)):
        raise CatalogRegistrationError(None, "tools must be a list")
    parsed: list[RegisteredTool] = []
    seen = {} if seen is None else seen
    for index, tool in enumerate(tools, first):
        try:
            registered = _parse_tool(index, tool, check_schemas, copy)
        except (_ToolProblemError, ValueError) as error:
            raise CatalogRegistrationError(index, str(error), _tool_label(tool)) from None
        except RecursionError:
            raise CatalogRegistrationError(index, "a schema is nested too deeply to process", _tool_label(tool)) from None
        entry_id = registered.entry.id
        if entry_id in seen:
            raise CatalogRegistrationError(index, f"duplicate id {entry_id} (also tool {seen[entry_id]})", entry_id)
        seen[entry_id] = index
        parsed.append(registered)
    return parsed


def parse_mode(mode: object) -> Mode:
    """Validates a registration mode; ``None`` means ``"replace"``.

    Raises:
        CatalogRegistrationError: The mode is not ``"replace"`` or ``"merge"``.
    """
    if mode is None or mode == "replace":
        return "replace"
    if mode == "merge":
        return "merge"
    raise CatalogRegistrationError(None, "mode must be replace or merge")


def parse_name_list(value: object, field: str) -> tuple[str, ...] | None:
    """Validates an optional list of tool ids or names (``allow``, ``deny``, ``directToolNames``).

    Returns:
        The items, or ``None`` when the list was not given.

    Raises:
        CatalogRegistrationError: The value is not a list of strings, has more than
            ``MAX_TOOLS_PER_REQUEST`` items, or an item is longer than any catalog id
            (``MAX_CATALOG_ID_CHARS``, SPEC §3.2 item 1): such an item could match nothing.
    """
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise CatalogRegistrationError(None, f"{field} must be a list of strings")
    if not all(isinstance(item, str) for item in value):
        raise CatalogRegistrationError(None, f"{field} must be a list of strings")
    if len(value) > MAX_TOOLS_PER_REQUEST:
        raise CatalogRegistrationError(None, f"{field} has {len(value)} items, more than {MAX_TOOLS_PER_REQUEST}")
    for index, item in enumerate(value):
        if len(item) > MAX_CATALOG_ID_CHARS:
            raise CatalogRegistrationError(None, f"{field} item {index} is longer than {MAX_CATALOG_ID_CHARS} characters (the longest tool id)")
    return tuple(value)
