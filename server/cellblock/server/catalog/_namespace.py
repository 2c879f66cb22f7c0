"""The ``MCP`` namespace map, its ``API`` files and ``$api()`` data (SPEC §8.5–8.7).

Everything here is computed from a run's catalog view when the run starts and handed to the
cell as data: the guest builds ``MCP`` and answers ``API.*`` and ``$api()`` from it without a
bridge request, and the host keeps :attr:`McpNamespace.paths` to accept ``namespace``
requests (SPEC §8.5 item 7). The declaration texts come from :mod:`._declarations`.

Typical use::

    ns = build_namespace(view.entries)
    ns.paths["memory.createEntities"]        # -> "mcp:memory:create_entities"
    ns.api_files()                           # [{path, description, content, bytes}, ...]
    ns.guest_data()                          # the cell's ``mcp`` data and ``apiFiles``
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import structlog

from ._declarations import (
    INDEX_DESCRIPTION,
    OPERATION_PATHS,
    ROOT_NOTE,
    Blocks,
    McpServer,
    McpTool,
    render_index,
    render_server,
    server_note,
    server_pieces,
)
from ._entries import CatalogEntry
from ._identifiers import TOOL_RESERVED, assign_identifiers, server_identifiers
from ._text import compact_json

__all__ = ["McpNamespace", "build_namespace"]

log = structlog.get_logger("cellblock.catalog")


def _file(path: str, description: str, content: str) -> dict[str, Any]:
    return {"path": path, "description": description, "content": content, "bytes": len(content.encode("utf-8", "surrogatepass"))}


@dataclass(frozen=True)
class McpNamespace:
    """The ``MCP`` namespace of one catalog view.

    Attributes:
        servers: Servers in identifier order.
        paths: Bridge path (``<server>.<method>``) -> catalog id, the run's namespace map.
    """

    servers: tuple[McpServer, ...] = ()
    paths: dict[str, str] = field(default_factory=dict)

    def index_content(self) -> str:
        """The content of ``mcp/index.d.ts`` (``""`` without servers)."""
        return render_index([s.identifier for s in self.servers]) if self.servers else ""

    def api_files(self, blocks: Blocks | None = None) -> list[dict[str, Any]]:
        """The ``API`` files (SPEC §8.6 item 1): none without servers.

        Args:
            blocks: Tool blocks :meth:`guest_data` rendered (``render_server``), or ``None``.

        Returns:
            ``[{path, description, content, bytes}]``: ``mcp/index.d.ts``, then one file per
            server in identifier order.
        """
        if not self.servers:
            return []
        files = [_file("mcp/index.d.ts", INDEX_DESCRIPTION, self.index_content())]
        for server in self.servers:
            files.append(_file(server.file_path, f"MCP server declaration for {server.name}.", render_server(server.identifier, server.tools, blocks)))
        return files

    def guest_data(self, blocks: Blocks | None = None) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
        """The ``mcp`` data the cell builds ``MCP`` and answers ``$api()`` from, and its ``apiFiles``.

        Every declaration text is a *template*: a list of indexes into ``mcp.texts``, the
        distinct pieces of the rendered files (:func:`._declarations.server_pieces`), to be
        concatenated. A tool's block is sent once, for its server file and every ``$api()``
        header that selects it; schemas are sent once, as compact JSON text.

        Args:
            blocks: Tool blocks rendered so far (filled here, for :meth:`api_files`), or ``None``.

        Returns:
            ``(None, [])`` without servers, else ``(mcp, files)``. ``mcp`` is ``{texts, root:
            {header, servers, note}, servers: [...]}`` where each server has ``identifier``,
            ``serverName``, ``header``, ``note``, ``tools`` (``$api`` summaries plus
            ``bridgePath``, ``parameters`` as JSON text, ``required`` and ``defaults`` as
            ``[name, JSON text]`` pairs) and ``selectors`` (selector text -> ``[tool indexes,
            header]``). ``files`` are :meth:`api_files` with ``content`` a template.
        """
        if not self.servers:
            return None, []
        blocks = {} if blocks is None else blocks
        texts = _Texts()
        servers = []
        files: list[dict[str, Any]] = [{"path": "mcp/index.d.ts", "description": INDEX_DESCRIPTION, "content": texts.template([self.index_content()])}]
        for server in self.servers:
            # One pass: each selector text's tools in index order (a text a tool has twice, once).
            chosen_by: dict[str, list[int]] = {}
            for i, t in enumerate(server.tools):
                for text in dict.fromkeys((t.method, t.path, t.mcp_tool)):
                    chosen_by.setdefault(text, []).append(i)
            templates: dict[tuple[int, ...], list[int]] = {}
            for chosen in chosen_by.values():
                key = tuple(chosen)
                if key not in templates:
                    templates[key] = texts.template(server_pieces(server.identifier, [server.tools[i] for i in chosen], blocks))
            header = texts.template(server_pieces(server.identifier, server.tools, blocks))
            files.append({"path": server.file_path, "description": f"MCP server declaration for {server.name}.", "content": header})
            servers.append(
                {
                    "identifier": server.identifier,
                    "serverName": server.name,
                    "header": header,
                    "note": server_note(server.identifier),
                    "tools": [_guest_tool(t) for t in server.tools],
                    "selectors": {text: [chosen, templates[tuple(chosen)]] for text, chosen in chosen_by.items()},
                }
            )
        for f in files:
            f["bytes"] = sum(texts.utf8_bytes[i] for i in f["content"])
        root = {
            "header": files[0]["content"],
            "servers": compact_json([{"identifier": s.identifier, "serverName": s.name, "toolCount": len(s.tools)} for s in self.servers]),
            "note": ROOT_NOTE,
        }
        return {"texts": texts.items, "root": root, "servers": servers}, files


class _Texts:
    """The distinct declaration pieces of a guest catalog (``mcp.texts``) and their UTF-8 sizes."""

    def __init__(self) -> None:
        self.items: list[str] = []
        self.utf8_bytes: list[int] = []
        self._index: dict[str, int] = {}

    def template(self, pieces: Iterable[str]) -> list[int]:
        """The indexes of ``pieces`` (each added once), empty pieces left out."""
        out = []
        for piece in pieces:
            if not piece:
                continue
            index = self._index.get(piece)
            if index is None:
                index = self._index[piece] = len(self.items)
                self.items.append(piece)
                self.utf8_bytes.append(len(piece.encode("utf-8", "surrogatepass")))
            out.append(index)
        return out


def _guest_tool(t: McpTool) -> dict[str, Any]:
    """A tool of a server's guest data: its ``$api`` summary, bridge path, schema text, required names and defaults."""
    item = t.summary()
    item["bridgePath"] = t.path[len("MCP.") :]
    item["parameters"] = "{}" if t.parameters is None else compact_json(t.parameters)
    schema = t.parameters if isinstance(t.parameters, dict) else {}
    raw_required = schema.get("required")
    item["required"] = list(dict.fromkeys(r for r in raw_required if isinstance(r, str))) if isinstance(raw_required, list) else []
    props = schema.get("properties")
    item["defaults"] = [[name, compact_json(sub["default"])] for name, sub in props.items() if isinstance(sub, dict) and "default" in sub] if isinstance(props, dict) else []
    return item


def build_namespace(entries: Iterable[CatalogEntry]) -> McpNamespace:
    """Builds the ``MCP`` namespace from catalog entries (SPEC §8.5 items 1-4).

    Servers are the distinct owners of ``mcp`` entries in server-name order; a server's
    entries are taken in id order. ``tool`` entries get unique tool identifiers; other
    operations sit at their fixed paths, the first entry by id winning (others are left out
    and logged).

    Args:
        entries: Catalog entries (other sources are ignored).

    Returns:
        The namespace (empty without ``mcp`` entries).
    """
    mcp = sorted((e for e in entries if e.source == "mcp"), key=lambda e: e.id)
    if not mcp:
        return McpNamespace()
    idents = server_identifiers(e.owner for e in mcp)
    servers: list[McpServer] = []
    paths: dict[str, str] = {}
    for name, ident in idents.items():
        own = [e for e in mcp if e.owner == name]
        plain = [e for e in own if (e.operation or "tool") == "tool"]
        methods = dict(zip((e.id for e in plain), assign_identifiers((e.name for e in plain), reserved=TOOL_RESERVED, fallback="tool"), strict=True))
        taken_ops: set[str] = set()
        tools: list[McpTool] = []
        for e in own:
            op = e.operation or "tool"
            if op == "tool":
                method = methods[e.id]
            else:
                if op in taken_ops:
                    log.warning("mcp.operation_duplicate", server=name, operation=op, entry_id=e.id)
                    continue
                taken_ops.add(op)
                method = OPERATION_PATHS[op]
            tool = McpTool(e.id, method, f"MCP.{ident}.{method}", e.name, op, e.description, e.parameters)
            tools.append(tool)
            paths[f"{ident}.{method}"] = e.id
        servers.append(McpServer(name, ident, tuple(tools)))
    servers.sort(key=lambda s: s.identifier)
    return McpNamespace(tuple(servers), paths)
