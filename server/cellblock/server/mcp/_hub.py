"""cellblock's own MCP client for operator-configured servers (SPEC §3.2 item 7).

:class:`McpHub` connects to every configured server at service start with the official MCP
Python SDK (``mcp.Client``, stdio or streamable HTTP), lists its tools (and resources and
prompts when the server has them) as ``mcp`` catalog entries, and calls them when a
namespace call targets one of their entries. Each session lives in its own task (the SDK's
transports are anyio task groups that must be entered and left in one task); calls are
plain awaits on the connected client.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from typing import Any

import structlog
from mcp import Client, MCPError, StdioServerParameters
from mcp_types import INVALID_PARAMS

from cellblock.server import messages as msg
from cellblock.server.catalog import CatalogEntry, compact_json
from cellblock.server.mcp._config import McpServerConfig
from cellblock.server.runs import ToolOutcome

__all__ = ["OPERATION_TOOLS", "McpHub"]

log = structlog.get_logger("cellblock.mcp")

#: Most ``*/list`` pages read per listing; a server that never ends its pagination is cut here.
MAX_LIST_PAGES = 100

_CURSOR = {"cursor": {"type": "string", "description": "Opaque pagination cursor from a previous page's nextCursor."}}

OPERATION_TOOLS: dict[str, dict[str, Any]] = {
    "resources.list": {
        "name": "resources/list",
        "description": "Lists the server's resources (one page; pass nextCursor as cursor for the next).",
        "parameters": {"type": "object", "properties": _CURSOR},
    },
    "resources.read": {
        "name": "resources/read",
        "description": "Reads one resource by URI.",
        "parameters": {"type": "object", "required": ["uri"], "properties": {"uri": {"type": "string", "description": "The resource URI."}}},
    },
    "prompts.list": {
        "name": "prompts/list",
        "description": "Lists the server's prompts (one page; pass nextCursor as cursor for the next).",
        "parameters": {"type": "object", "properties": _CURSOR},
    },
    "prompts.get": {
        "name": "prompts/get",
        "description": "Gets one prompt, filled with its arguments.",
        "parameters": {
            "type": "object",
            "required": ["name"],
            "properties": {
                "name": {"type": "string", "description": "The prompt name."},
                "arguments": {"type": "object", "description": "Prompt arguments (string values)."},
            },
        },
    },
}
"""Registration of the non-tool operations (SPEC §3.2 item 2 ``operation``), by operation."""


def _error_text(exc: BaseException) -> str:
    """``Class: message`` of an exception, unwrapping single-member exception groups (anyio)."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return f"{exc.__class__.__name__}: {exc}"[:300]


def _dump(result: Any) -> dict[str, Any]:
    """An SDK result as its MCP JSON form (camelCase keys, no nulls, no ``resultType``)."""
    data: dict[str, Any] = result.model_dump(mode="json", by_alias=True, exclude_none=True)
    data.pop("resultType", None)
    return data


class _Session:
    """One connected server: its client, its registrations and the task that owns it."""

    def __init__(self, config: McpServerConfig) -> None:
        self.config = config
        self.client: Client | None = None
        self.tools: list[dict[str, Any]] = []
        self.operations: set[str] = set()
        self.tool_names: set[str] = set()
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.stop = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    def target(self) -> StdioServerParameters | str:
        if self.config.url:
            return self.config.url
        command, *args = self.config.command
        return StdioServerParameters(command=command, args=args, env=dict(self.config.env) or None, cwd=self.config.cwd)

    async def run(self, connect_timeout_s: float) -> None:
        try:
            # mode="legacy": the initialize handshake every released server speaks;
            # cache=None: list operations always reach the server.
            async with Client(self.target(), mode="legacy", cache=None) as client:
                async with asyncio.timeout(connect_timeout_s):
                    await self._list(client)
                self.client = client
                self.ready.set_result(None)
                await self.stop.wait()
        except BaseException as exc:  # noqa: BLE001 - reported through `ready` or the log
            if not self.ready.done():
                self.ready.set_exception(exc if isinstance(exc, Exception) else RuntimeError(repr(exc)))
            elif not isinstance(exc, asyncio.CancelledError):
                log.error("mcp.session_ended", server=self.config.name, error=_error_text(exc))
            if isinstance(exc, asyncio.CancelledError):
                raise
        finally:
            self.client = None

    async def _list(self, client: Client) -> None:
        name = self.config.name
        tools: list[dict[str, Any]] = []
        cursor: str | None = None
        for _ in range(MAX_LIST_PAGES):
            page = await client.list_tools(cursor=cursor)
            for tool in page.tools:
                item: dict[str, Any] = {"source": "mcp", "owner": name, "name": tool.name, "description": tool.description or ""}
                if tool.title:
                    item["label"] = tool.title
                item["parameters"] = tool.input_schema
                tools.append(item)
            cursor = page.next_cursor
            if not cursor:
                break
        caps = client.server_capabilities
        groups = []
        if caps.resources is not None:
            groups += ["resources.list", "resources.read"]
        if caps.prompts is not None:
            groups += ["prompts.list", "prompts.get"]
        for op in groups:
            spec = OPERATION_TOOLS[op]
            tools.append({"source": "mcp", "owner": name, "name": spec["name"], "description": spec["description"], "parameters": spec["parameters"], "operation": op})
            self.operations.add(op)
        self.tools = tools
        self.tool_names = {t["name"] for t in tools if "operation" not in t}

    async def call(self, entry: CatalogEntry, arguments: dict[str, Any]) -> dict[str, Any]:
        client = self.client
        if client is None:
            raise ConnectionError(f"MCP server {self.config.name} is not connected")
        op = entry.operation or "tool"
        if op == "tool":
            return _dump(await client.call_tool(entry.name, arguments))
        if op == "resources.list":
            return _dump(await client.list_resources(cursor=arguments.get("cursor")))
        if op == "resources.read":
            return _dump(await client.read_resource(str(arguments.get("uri", ""))))
        if op == "prompts.list":
            return _dump(await client.list_prompts(cursor=arguments.get("cursor")))
        prompt_args = arguments.get("arguments")
        return _dump(await client.get_prompt(str(arguments.get("name", "")), {str(k): str(v) for k, v in prompt_args.items()} if isinstance(prompt_args, dict) else None))


class McpHub:
    """The cellblock-hosted MCP servers of one service instance.

    Args:
        configs: The configured servers (:func:`~cellblock.server.mcp.parse_mcp_servers`).
        connect_timeout_s: Bound on connecting to and listing one server at start, in seconds.
        call_timeout_s: Bound on one call, in seconds (``None``: unbounded; the run's own
            deadline parks it and abandonment cancels it).
    """

    def __init__(self, configs: Sequence[McpServerConfig], *, connect_timeout_s: float = 30.0, call_timeout_s: float | None = None) -> None:
        self._configs = tuple(configs)
        self._connect_timeout_s = connect_timeout_s
        self._call_timeout_s = call_timeout_s
        self._sessions: dict[str, _Session] = {}
        self._calls: dict[str, asyncio.Task[None]] = {}

    @property
    def server_names(self) -> list[str]:
        """Names of the connected servers, sorted."""
        return sorted(self._sessions)

    async def start(self) -> None:
        """Connects to every configured server and lists its tools.

        A server that cannot be reached or listed is logged as an error and left out (its
        tools are then absent from every catalog); the others still serve.
        """
        pending: list[_Session] = []
        for config in self._configs:
            session = _Session(config)
            session.task = asyncio.create_task(session.run(self._connect_timeout_s), name=f"mcp:{config.name}")
            pending.append(session)
        for session in pending:
            name = session.config.name
            try:
                await asyncio.wait_for(asyncio.shield(session.ready), self._connect_timeout_s + 5.0)
            except BaseException as exc:  # noqa: BLE001 - one bad server must not stop the service
                log.error("mcp.connect_failed", server=name, error=_error_text(exc))
                session.stop.set()
                if session.task is not None:
                    session.task.cancel()
                    with contextlib.suppress(BaseException):
                        await session.task
                continue
            self._sessions[name] = session
            log.info("mcp.connected", server=name, transport="http" if session.config.url else "stdio", tools=len(session.tools))

    def tools(self) -> list[dict[str, Any]]:
        """Registration dicts (SPEC §3.2) of every hosted server's entries, by server name."""
        return [dict(t) for name in self.server_names for t in self._sessions[name].tools]

    def serves(self, entry: CatalogEntry) -> bool:
        """Whether ``entry`` is one of a hosted server's entries (then cellblock calls it)."""
        if entry.source != "mcp":
            return False
        session = self._sessions.get(entry.owner)
        if session is None:
            return False
        op = entry.operation or "tool"
        return entry.name in session.tool_names if op == "tool" else op in session.operations

    def start_call(
        self,
        entry: CatalogEntry,
        arguments: dict[str, Any],
        *,
        nested_call_id: str,
        run_id: str,
        parent_tool_call_id: str,
        on_done: Callable[[ToolOutcome], None],
    ) -> None:
        """Starts one call; ``on_done`` receives its outcome (never on cancellation).

        Args:
            entry: A hosted entry (:meth:`serves` is true).
            arguments: The tool input (a JSON object).
            nested_call_id: The call's nested call id (cancellation key, logs).
            run_id: The calling run, for logs.
            parent_tool_call_id: The exec's tool-call id, for logs.
            on_done: Called once with the outcome: ``ok_json`` holding the MCP result (for
                tools the ``CallToolResult``: ``content``, ``structuredContent``,
                ``isError``), or ``failed``/``invalid_input`` with a message.
        """
        session = self._sessions[entry.owner]
        bound = log.bind(server=entry.owner, catalog_id=entry.id, nested_call_id=nested_call_id, run_id=run_id, tool_call_id=parent_tool_call_id)

        async def run() -> None:
            started = time.monotonic()
            try:
                if self._call_timeout_s is None:
                    result = await session.call(entry, arguments)
                else:
                    result = await asyncio.wait_for(session.call(entry, arguments), self._call_timeout_s)
                outcome = ToolOutcome(nested_call_id, ok_json=compact_json(result))
                bound.info("mcp.call_completed", is_error=bool(result.get("isError")), duration_ms=int((time.monotonic() - started) * 1000))
            except asyncio.CancelledError:
                bound.info("mcp.call_cancelled", duration_ms=int((time.monotonic() - started) * 1000))
                raise
            except MCPError as exc:
                kind = "invalid_input" if exc.code == INVALID_PARAMS else "failed"
                outcome = ToolOutcome(nested_call_id, error_kind=kind, error_message=msg.escape_lone_surrogates(f"MCP server {entry.owner}: {exc.message}"[:2000]))
                bound.warning("mcp.call_failed", code=exc.code, error=exc.message[:300], duration_ms=int((time.monotonic() - started) * 1000))
            except Exception as exc:  # noqa: BLE001 - any transport/validation fault is a failed call
                outcome = ToolOutcome(nested_call_id, error_kind="failed", error_message=f"MCP server {entry.owner} failed: {exc.__class__.__name__}")
                bound.error("mcp.call_failed", error=f"{exc.__class__.__name__}: {exc}"[:300], duration_ms=int((time.monotonic() - started) * 1000))
            finally:
                self._calls.pop(nested_call_id, None)
            on_done(outcome)

        bound.info("mcp.call_started", operation=entry.operation or "tool")
        self._calls[nested_call_id] = asyncio.create_task(run(), name=f"mcp-call:{nested_call_id}")

    def cancel(self, nested_call_id: str) -> bool:
        """Cancels an abandoned hosted call.

        Returns:
            True when ``nested_call_id`` was a hosted call still running.
        """
        task = self._calls.pop(nested_call_id, None)
        if task is None:
            return False
        task.cancel()
        return True

    async def close(self, timeout_s: float = 5.0) -> None:
        """Cancels running calls and shuts every session down (stdio servers are stopped)."""
        for task in list(self._calls.values()):
            task.cancel()
        self._calls.clear()
        sessions = list(self._sessions.values())
        self._sessions.clear()
        for session in sessions:
            session.stop.set()
        tasks = [s.task for s in sessions if s.task is not None]
        if not tasks:
            return
        done, still = await asyncio.wait(tasks, timeout=timeout_s)
        for task in still:
            task.cancel()
        for task in [*done, *still]:
            with contextlib.suppress(BaseException):
                await task
        log.info("mcp.closed", servers=len(sessions))
