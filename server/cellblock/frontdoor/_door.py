"""The MCP server of the front door: ``exec`` and ``wait`` over `cellblock.client` (SPEC §3.7).

Built on the official MCP SDK's low-level ``mcp.server.Server`` (``MCPServer``, the
decorator layer, derives schemas from Python signatures; the front door must serve
the schemas and descriptions of ``GetToolSurface`` byte for byte). One `FrontDoor`
serves one transport; sessions are keyed by the transport (`SessionKey`).

A ``tools/call`` of ``exec`` or ``wait`` is one cellblock leg:

- the result is the leg's model-facing JSON (``Result.result_json``) verbatim as the
  only text content block, the same object parsed as ``structuredContent``, and
  ``isError`` true exactly when ``status`` is ``"failed"``;
- each output entry the leg accepts is sent as it is produced, as a progress
  notification (when the request carried a ``progressToken``; ``message`` is the
  entry's compact JSON) and as a ``notifications/message`` log entry (logger
  ``cellblock.output``, level ``info``) when the client opted in to logging;
- cancelling the request (``notifications/cancelled``) cancels the handler, and
  `cellblock.client` sends ``Cancel``: the leg ends ``aborted`` and the run can never
  be resumed (SPEC §3.6, §10.9).
"""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Callable
from typing import Any, Literal

import mcp_types as types
import structlog
from mcp import MCPError
from mcp.server import Server, ServerRequestContext
from mcp.server.connection import allowed_log_levels
from mcp.shared.exceptions import MCPDeprecationWarning
from mcp_types import INTERNAL_ERROR, INVALID_PARAMS, INVALID_REQUEST
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from opentelemetry import propagate

from cellblock.client import CellblockClient, CellblockError, OutputEntry, RunResult
from cellblock.frontdoor._sessions import CodeModeNotEngagedError, SessionScope, SessionScopes

__all__ = ["INSTRUCTIONS", "FrontDoor", "SessionKey", "entry_json", "http_session", "stdio_session", "tool_result"]

log = structlog.get_logger("cellblock.frontdoor")

#: The server's ``instructions``: where the guidance is (the ``exec`` description).
INSTRUCTIONS = (
    "cellblock code mode: the tools of the MCP servers behind this server are reached from a program, not one call "
    "at a time. Call `exec` with a JavaScript or TypeScript program (its description says how to find and call the "
    "tools); when a result has status \"waiting\", call `wait` with its runId."
)

#: Logging levels in RFC 5424 order, least severe first (MCP ``LoggingLevel``).
_LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")

SessionKey = Callable[[ServerRequestContext[Any, Any]], str | None]
"""Maps a request to its session key, or ``None`` when the request has no session."""


def stdio_session(_ctx: ServerRequestContext[Any, Any]) -> str:
    """The stdio transport is one connection per process: one session."""
    return "stdio"


def http_session(ctx: ServerRequestContext[Any, Any]) -> str | None:
    """The ``Mcp-Session-Id`` of a stateful streamable-HTTP request (the SDK has checked it exists)."""
    request = ctx.request
    headers = getattr(request, "headers", None)
    if headers is None:
        return None
    value = headers.get("mcp-session-id")
    return str(value) if value else None


def entry_json(entry: OutputEntry) -> dict[str, Any]:
    """The SPEC §10.5 JSON object of a streamed output entry (``text`` or ``json``)."""
    if entry.type == "text":
        return {"type": "text", "text": entry.text or ""}
    if entry.type == "json":
        return {"type": "json", "value": entry.value}
    return {
        "type": entry.type,
        "truncated": True,
        "omittedBytes": entry.omitted_bytes,
        "omittedEntries": entry.omitted_entries,
        "guidance": entry.guidance,
        "prefix": entry.prefix,
    }


#: A ``\\uXXXX`` escape of a lone UTF-16 surrogate in JSON text (not one half of an escaped pair, not after an escaped backslash).
_LONE_ESCAPE = re.compile(
    r"(?<!\\)((?:\\\\)*)(\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})|(?<!\\u[dD][89abAB][0-9a-fA-F]{2})\\u[dD][c-fC-F][0-9a-fA-F]{2})"
)


def encodable_json(text: str) -> str:
    r"""JSON text whose lone-surrogate escapes (``"\ud800"``) are U+FFFD escapes (SPEC §3.7 item 4).

    The service's JSON may spell a lone UTF-16 surrogate a guest made; decoded, it is a ``str``
    the MCP SDK cannot write as UTF-8 JSON, so the structured copies the front door decodes
    replace it. The text itself (the result's text content) is already valid UTF-8 and kept.

    Args:
        text: JSON text (ASCII escapes for lone surrogates, as compact JSON writes them).

    Returns:
        ``text`` with each such escape replaced by ``\ufffd``; ``text`` itself when it has none.
    """
    return _LONE_ESCAPE.sub(r"\1\\ufffd", text) if "\\u" in text else text


def _compact(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: ASCII JSON, its escape replaced
        return encodable_json(json.dumps(value, separators=(",", ":")))
    return text


def tool_result(result: RunResult) -> types.CallToolResult:
    """The MCP tool result of one leg: the model-facing JSON verbatim (SPEC §3.7 item 4)."""
    try:
        structured = json.loads(encodable_json(result.raw_json))
    except ValueError:
        structured = None
    meta = {"cellblock/traceId": result.trace_id} if result.trace_id else None
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=result.raw_json)],
        structured_content=structured if isinstance(structured, dict) else None,
        is_error=result.status == "failed",
        _meta=meta,
    )


class FrontDoor:
    """The MCP front door of one transport.

    Args:
        client: A connected cellblock client (in-process service or remote).
        session_key: How a request names its session (`stdio_session`, `http_session`).
        model_id: The model id for ``GetToolSurface``; empty means unknown (code mode
            must then be enabled outright on the service).
        handshake_only: Advertise only the initialize-handshake protocol versions in
            ``server/discover`` (streamable HTTP: 2026-07-28 requests carry no session,
            so a client that probes falls back to a session).
    """

    def __init__(
        self,
        client: CellblockClient,
        session_key: SessionKey,
        *,
        model_id: str = "",
        handshake_only: bool = False,
    ) -> None:
        self.client = client
        self.sessions = SessionScopes(client, model_id)
        self._session_key = session_key
        # logging/setLevel is deprecated at 2026-07-28 (SEP-2577) but is how handshake-era
        # clients opt in to notifications/message; the SDK warns when the handler is passed.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", MCPDeprecationWarning)
            self.server: Server[Any] = Server(
                "cellblock",
                version="0.1.0",
                title="cellblock code mode",
                instructions=INSTRUCTIONS,
                on_list_tools=self._list_tools,
                on_call_tool=self._call_tool,
                on_set_logging_level=self._set_logging_level,
            )
        if handshake_only:
            self.server.add_request_handler("server/discover", types.RequestParams, self._discover_handshake_only)

    # -- handlers -------------------------------------------------------------

    async def _session(self, ctx: ServerRequestContext[Any, Any]) -> SessionScope:
        key = self._session_key(ctx)
        if key is None:
            raise MCPError(
                code=INVALID_REQUEST,
                message="cellblock's MCP front door needs a session (the initialize handshake): "
                "runs suspended by exec are resumed by wait in the same session",
            )
        try:
            return await self.sessions.open(key)
        except CodeModeNotEngagedError as exc:
            raise MCPError(code=INTERNAL_ERROR, message=str(exc)) from None
        except CellblockError as exc:
            raise MCPError(code=INTERNAL_ERROR, message=f"cellblock service: {exc}") from None

    async def _list_tools(self, ctx: ServerRequestContext[Any, Any], _params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        session = await self._session(ctx)
        return types.ListToolsResult(
            tools=[types.Tool(name=t.name, description=t.description, input_schema=t.parameters) for t in session.tools]
        )

    async def _set_logging_level(self, ctx: ServerRequestContext[Any, Any], params: types.SetLevelRequestParams) -> types.EmptyResult:
        session = await self._session(ctx)
        session.log_level = params.level
        return types.EmptyResult()

    async def _discover_handshake_only(self, ctx: ServerRequestContext[Any, Any], _params: types.RequestParams | None) -> types.DiscoverResult:
        return types.DiscoverResult(
            supported_versions=list(HANDSHAKE_PROTOCOL_VERSIONS),
            capabilities=self.server.get_capabilities(),
            instructions=INSTRUCTIONS,
        )

    async def _call_tool(self, ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams) -> types.CallToolResult:
        session = await self._session(ctx)
        name = params.name
        if name not in ("exec", "wait"):
            raise MCPError(code=INVALID_PARAMS, message=f"Unknown tool: {name}")
        arguments: dict[str, Any] = dict(params.arguments or {})
        on_output = self._output_sink(ctx, session)
        tool_call_id = session.next_tool_call_id(name)
        # The SDK's server span of this request (parented to the client's `_meta` traceparent) is the
        # parent of the leg's trace: the run's spans join the MCP client's trace (SPEC §12).
        metadata: dict[str, str] = {}
        propagate.inject(metadata)
        with session.call(), structlog.contextvars.bound_contextvars(session_id=session.scope.session_id, tool_call_id=tool_call_id):
            try:
                if name == "exec":
                    result = await self.client.exec(session.scope, tool_call_id=tool_call_id, arguments=arguments, on_output=on_output, metadata=metadata)
                else:
                    result = await self.client.wait(session.scope, tool_call_id=tool_call_id, arguments=arguments, on_output=on_output, metadata=metadata)
            except CellblockError as exc:
                # Not a run result (admission, transport): the model still sees it as a tool error.
                log.warning("frontdoor.leg_refused", tool=name, error=str(exc))
                return types.CallToolResult(content=[types.TextContent(type="text", text=f"cellblock refused the {name} call: {exc}")], is_error=True)
        return tool_result(result)

    def _output_sink(self, ctx: ServerRequestContext[Any, Any], session: SessionScope) -> Callable[[OutputEntry], Any]:
        """Streams output entries as progress and (opted-in) log notifications of this request."""
        count = 0
        # 2026-07-28: this request's log-level `_meta` is the opt-in; handshake versions allow every level,
        # and the front door sends log entries only to sessions that asked with logging/setLevel.
        logs = "info" in allowed_log_levels(ctx.protocol_version, ctx.meta)
        if ctx.protocol_version in HANDSHAKE_PROTOCOL_VERSIONS:
            logs = logs and _allows(session.log_level, "info")

        async def send(entry: OutputEntry) -> None:
            nonlocal count
            count += 1
            data = entry_json(entry)
            try:
                await ctx.session.report_progress(count, None, _compact(data))
                if logs:
                    message = types.LoggingMessageNotification(params=types.LoggingMessageNotificationParams(level="info", data=data, logger="cellblock.output"))
                    await ctx.session.send_notification(message, related_request_id=ctx.request_id)
            except Exception as exc:  # noqa: BLE001 - notifications are advisory; the result carries the output
                log.debug("frontdoor.notify_failed", error=str(exc))

        return send


def _allows(requested: str | None, level: Literal["info"]) -> bool:
    """Whether a handshake-era session asked for ``level`` (no ``logging/setLevel``: no log entries)."""
    return requested in _LEVELS and _LEVELS.index(level) >= _LEVELS.index(requested)
