"""TypeScript declarations of ``MCP`` servers and tools: the text of the ``API`` files (SPEC §8.6).

Schema → declaration type, tool parameters → a typed parameter list, and the rendered
``mcp/index.d.ts`` and per-server files. :mod:`._namespace` assembles them into a run's
``MCP`` namespace.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ._text import compact_json, is_json_primitive

__all__ = [
    "INDEX_DESCRIPTION",
    "OPERATION_PATHS",
    "ROOT_NOTE",
    "Blocks",
    "McpServer",
    "McpTool",
    "Parameter",
    "declaration_type",
    "render_index",
    "render_server",
    "server_pieces",
    "server_note",
    "tool_block",
    "tool_parameters",
]

MAX_ENUM_LITERALS = 16
"""An ``enum`` of at most this many primitives becomes a literal union."""
MAX_UNION_VARIANTS = 8
"""``oneOf``/``anyOf`` with 1 to this many variants become a union."""
MAX_DEPTH = 8
"""Nesting deeper than this many levels renders as ``unknown``."""
MAX_DOC_LINES = 12
"""At most this many description lines go into a tool's doc comment."""

ROOT_NOTE = (
    'Read "mcp/<server>.d.ts" with API.read, or call MCP.<server>.$api(toolName, { schema: true }) '
    "for one tool's JSON Schema."
)
"""``note`` of ``MCP.$api()`` (SPEC §8.7 item 1), literal."""

INDEX_DESCRIPTION = "Root MCP namespace declaration and list of servers."
"""Description of ``mcp/index.d.ts`` (SPEC §8.6 item 1)."""

OPERATION_PATHS = {
    "resources.list": "resources.list",
    "resources.read": "resources.read",
    "prompts.list": "prompts.list",
    "prompts.get": "prompts.get",
}
_IDENTIFIER = re.compile(r"^[A-Za-z_$][A-Za-z0-9_$]*$")

_SERVER_PRELUDE = (
    "type McpApiHeader = { header: string; tools?: unknown[]; schemas?: Record<string, unknown> };\n"
    "\n"
    "type McpToolResult = {\n"
    "  content?: unknown[];\n"
    "  structuredContent?: unknown;\n"
    "  isError?: boolean;\n"
    "  [key: string]: unknown;\n"
    "};\n"
    "\n"
)
_SERVER_API = (
    "  /** Returns this declaration header; pass a tool name and { schema: true } for its JSON Schema. */\n"
    "  function $api(toolName?: string, options?: { schema?: boolean }): Promise<McpApiHeader>;\n"
)


def server_note(identifier: str) -> str:
    """``note`` of ``MCP.<server>.$api()`` (SPEC §8.7 item 2)."""
    return (
        f"Call MCP.{identifier}.<tool>({{ ... }}) with one object argument; "
        "pass { schema: true } to include JSON Schemas."
    )


# ---------------------------------------------------------------- declaration types
def _union(parts: Sequence[str]) -> str:
    return " | ".join(parts)


def _property_name(name: str) -> str:
    return name if _IDENTIFIER.match(name) else compact_json(name)


def declaration_type(schema: Any, depth: int = 0) -> str:
    """Renders a JSON Schema as a declaration type (SPEC §8.6, "Declaration types").

    Args:
        schema: A JSON Schema (any JSON value; non-objects give ``unknown``).
        depth: Nesting level of ``schema``; deeper than :data:`MAX_DEPTH` gives ``unknown``.

    Returns:
        The type text, e.g. ``Array<{ id: string; tags?: Array<string> }>``.
    """
    if depth > MAX_DEPTH or not isinstance(schema, dict):
        return "unknown"
    enum = schema.get("enum")
    if isinstance(enum, list) and 1 <= len(enum) <= MAX_ENUM_LITERALS and all(is_json_primitive(v) for v in enum):
        return _union([compact_json(v) for v in enum])
    for key in ("oneOf", "anyOf"):
        variants = schema.get(key)
        if isinstance(variants, list) and 1 <= len(variants) <= MAX_UNION_VARIANTS:
            return _union([declaration_type(v, depth + 1) for v in variants])
    kind = schema.get("type")
    if isinstance(kind, list) and kind and all(isinstance(k, str) for k in kind):
        return _union([_typed(schema, k, depth) for k in kind])
    if isinstance(kind, str):
        return _typed(schema, kind, depth)
    return "unknown"


def _typed(schema: dict[str, Any], kind: str, depth: int) -> str:
    if kind == "string":
        return "string"
    if kind in ("number", "integer"):
        return "number"
    if kind == "boolean":
        return "boolean"
    if kind == "null":
        return "null"
    if kind == "array":
        return f"Array<{declaration_type(schema.get('items'), depth + 1)}>"
    if kind == "object":
        props = schema.get("properties")
        if not isinstance(props, dict) or not props:
            return "Record<string, unknown>"
        required = schema.get("required")
        required_set = {r for r in required if isinstance(r, str)} if isinstance(required, list) else set()
        fields = [
            f"{_property_name(name)}{'' if name in required_set else '?'}: {declaration_type(sub, depth + 1)}"
            for name, sub in props.items()
        ]
        return "{ " + "; ".join(fields) + " }"
    return "unknown"


# ---------------------------------------------------------------- tools and parameters
@dataclass(frozen=True)
class Parameter:
    """One top-level input property of an MCP tool.

    Attributes:
        name: The property name.
        required: Whether it is listed in ``required``.
        type: Its declaration type.
        description: Its description on one line, or ``None``.
        has_default: Whether the schema gives a ``default``.
        default: The ``default`` value (meaningful when ``has_default``).
    """

    name: str
    required: bool
    type: str
    description: str | None = None
    has_default: bool = False
    default: Any = None


def _one_line(text: str) -> str:
    return " ".join(line.strip() for line in text.splitlines() if line.strip())


def _doc_safe(text: str) -> str:
    return text.replace("*/", "* /")


def tool_parameters(schema: Any) -> list[Parameter]:
    """Lists a tool's parameters in declaration order (SPEC §8.6).

    Names in ``required`` that are properties come first, in ``required`` order, then the
    other properties in declaration order.

    Args:
        schema: The tool's ``parameters`` (any JSON value).

    Returns:
        The parameters; empty when the schema has no ``properties`` object.
    """
    if not isinstance(schema, dict) or not isinstance(schema.get("properties"), dict):
        return []
    props: dict[str, Any] = schema["properties"]
    raw_required = schema.get("required")
    required = [r for r in raw_required if isinstance(r, str) and r in props] if isinstance(raw_required, list) else []
    required = list(dict.fromkeys(required))
    order = required + [name for name in props if name not in required]
    params = []
    for name in order:
        sub = props[name]
        description = None
        has_default = False
        default = None
        if isinstance(sub, dict):
            if isinstance(sub.get("description"), str) and _one_line(sub["description"]):
                description = _one_line(sub["description"])
            if "default" in sub:
                has_default, default = True, sub["default"]
        params.append(Parameter(name, name in required, declaration_type(sub, 1), description, has_default, default))
    return params


@dataclass(frozen=True)
class McpTool:
    """One callable of a server in the ``MCP`` namespace.

    Attributes:
        entry_id: The catalog id the call dispatches to.
        method: Path inside the server, e.g. ``createIssue`` or ``resources.read``.
        path: Guest path, e.g. ``MCP.github.createIssue``.
        mcp_tool: The MCP tool's own name (the entry's ``name``).
        operation: The entry's ``operation``.
        description: The entry's description.
        parameters: The registered input schema, or ``None``.
    """

    entry_id: str
    method: str
    path: str
    mcp_tool: str
    operation: str
    description: str
    parameters: Any

    @property
    def params(self) -> list[Parameter]:
        """The tool's parameters (:func:`tool_parameters`)."""
        return tool_parameters(self.parameters)

    def summary(self) -> dict[str, Any]:
        """The ``tools`` item of ``$api()``: ``{method, path, mcpTool, operation, description}``."""
        return {
            "method": self.method,
            "path": self.path,
            "mcpTool": self.mcp_tool,
            "operation": self.operation,
            "description": self.description,
        }


@dataclass(frozen=True)
class McpServer:
    """One server of the ``MCP`` namespace.

    Attributes:
        name: The server name (owner of its entries).
        identifier: Its identifier in ``MCP``.
        tools: Its callables, in entry id order.
    """

    name: str
    identifier: str
    tools: tuple[McpTool, ...]

    @property
    def file_path(self) -> str:
        """``mcp/<identifier>.d.ts``."""
        return f"mcp/{self.identifier}.d.ts"


def _tool_block(tool: McpTool, name: str, indent: str) -> list[str]:
    lines: list[str] = []
    description = [_doc_safe(line.strip()) for line in tool.description.splitlines() if line.strip()][:MAX_DOC_LINES]
    params = tool.params
    documented = [p for p in params if p.description]
    if description or documented:
        lines.append(f"{indent}/**")
        lines.extend(f"{indent} * {line}" for line in description)
        if description and documented:
            lines.append(f"{indent} *")
        lines.extend(f"{indent} * @param {p.name}{'' if p.required else '?'} {_doc_safe(p.description or '')}" for p in documented)
        lines.append(f"{indent} */")
    if not params:
        lines.append(f"{indent}function {name}(input?: Record<string, never>): Promise<McpToolResult>;")
        return lines
    optional = "" if any(p.required for p in params) else "?"
    lines.append(f"{indent}function {name}(input{optional}: {{")
    inner = indent + "  "
    for p in params:
        doc = p.description or ""
        if p.has_default:
            default = f"Default: {compact_json(p.default)}."
            doc = f"{doc} {default}" if doc else default
        if doc:
            lines.append(f"{inner}/** {_doc_safe(doc)} */")
        lines.append(f"{inner}{_property_name(p.name)}{'' if p.required else '?'}: {p.type};")
    lines.append(f"{indent}}}): Promise<McpToolResult>;")
    return lines


def tool_block(tool: McpTool) -> str:
    """A tool's block of its server file (SPEC §8.6): single-segment tools at two spaces, grouped ones at four."""
    if "." in tool.method:
        return "\n".join(_tool_block(tool, tool.method.split(".", 1)[1], "    "))
    return "\n".join(_tool_block(tool, tool.method, "  "))


Blocks = dict[str, str]
"""Rendered tool blocks (:func:`tool_block`) by entry id, shared by the renders of one namespace build."""


def server_pieces(identifier: str, tools: Iterable[McpTool], blocks: Blocks | None = None) -> list[str]:
    """:func:`render_server` as the pieces it concatenates: the file's head, separators and one :func:`tool_block` per tool.

    The guest catalog sends each distinct piece once (a tool's block serves its server file and
    every ``$api()`` header that selects it), so the pieces are exactly the file's text in order.

    Args:
        identifier: The server identifier.
        tools: The tools to declare.
        blocks: Tool blocks rendered so far in this build (read and filled here), or ``None``.
    """
    cache: Blocks = {} if blocks is None else blocks

    def block(t: McpTool) -> str:
        found = cache.get(t.entry_id)
        if found is None:
            found = cache[t.entry_id] = tool_block(t)
        return found

    chosen = list(tools)
    single = sorted((t for t in chosen if "." not in t.method), key=lambda t: t.method)
    groups: dict[str, list[McpTool]] = {}
    for t in chosen:
        if "." in t.method:
            groups.setdefault(t.method.split(".", 1)[0], []).append(t)
    pieces = [_SERVER_PRELUDE + f"declare namespace MCP.{identifier} {{\n" + _SERVER_API.rstrip("\n")]
    for t in single:
        pieces += ["\n\n", block(t)]
    for group in sorted(groups):
        pieces.append(f"\n\n  namespace {group} {{")
        for i, t in enumerate(sorted(groups[group], key=lambda t: t.method)):
            pieces += ["\n\n" if i else "\n", block(t)]
        pieces.append("\n  }")
    pieces.append("\n}\n")
    return pieces


def render_server(identifier: str, tools: Iterable[McpTool], blocks: Blocks | None = None) -> str:
    """Renders ``mcp/<server>.d.ts`` for ``tools`` (SPEC §8.6).

    Args:
        identifier: The server identifier.
        tools: The tools to declare (all of the server's, or the ones ``$api`` selected).
        blocks: Tool blocks rendered so far in this build (read and filled here), or ``None``: the
            server's declaration, each of its selectors and its ``API`` file render every tool
            again otherwise (3,000 tools: 15,000 renders).

    Returns:
        The declaration text, ending in a newline.
    """
    return "".join(server_pieces(identifier, tools, blocks))


def render_index(identifiers: Sequence[str]) -> str:
    """Renders ``mcp/index.d.ts`` for servers in identifier order (SPEC §8.6).

    Args:
        identifiers: Server identifiers, in identifier order.

    Returns:
        The declaration text, ending in a newline.
    """
    refs = [f'/// <reference path="./{ident}.d.ts" />' for ident in identifiers]
    body = [
        "type McpApiHeader = { header: string; servers?: unknown[] };",
        "",
        "declare const MCP: {",
        "  /** Lists the visible MCP servers; read mcp/<server>.d.ts for their tools. */",
        "  $api(): Promise<McpApiHeader>;",
        *[f"  readonly {ident}: typeof MCP.{ident};" for ident in identifiers],
        "};",
    ]
    return "\n".join([*refs, "", *body]) + "\n"
