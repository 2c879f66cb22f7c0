"""One cellblock scope per MCP session (SPEC §3.7 item 3).

The front door talks to cellblock only through `cellblock.client`. A session's
scope is registered on first use with an empty catalog (the service's hosted MCP
servers join every catalog, SPEC §3.2 item 7), its tool surface is read once, and
the scope is ended with ``DeleteCatalog`` when the session ends, which aborts its
legs and discards its suspended runs (SPEC §3.6 item 3).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import structlog

from cellblock.client import CellblockClient, CellblockError, Scope, ToolDefinition

__all__ = ["AGENT_RUN_ID", "CodeModeNotEngagedError", "SessionScope", "SessionScopes"]

log = structlog.get_logger("cellblock.frontdoor")

#: The ``agent_run_id`` of every front-door scope; the MCP session is the ``session_id``.
AGENT_RUN_ID = "mcp"

#: The model-facing tools the front door serves (SPEC §4).
CODE_MODE_TOOLS = ("exec", "wait")


class CodeModeNotEngagedError(RuntimeError):
    """The service does not engage code mode for the front door's model id (SPEC §2.4)."""


@dataclass
class SessionScope:
    """The cellblock scope of one MCP session.

    Attributes:
        key: The transport's session key (the ``Mcp-Session-Id``, or ``stdio``).
        scope: ``(mcp-<key or random>, mcp)``.
        tools: The ``exec`` and ``wait`` definitions of the scope's tool surface.
        log_level: The level the client asked for with ``logging/setLevel``, or ``None``.
        in_flight: Tool calls running now.
        last_used: ``time.monotonic()`` of the last request.
    """

    key: str
    scope: Scope
    tools: list[ToolDefinition]
    log_level: str | None = None
    in_flight: int = 0
    last_used: float = field(default_factory=time.monotonic)
    _calls: Iterator[int] = field(default_factory=lambda: iter(range(1, 1 << 62)))

    def next_tool_call_id(self, tool: str) -> str:
        """A tool-call id unique in the session, e.g. ``mcp-exec-3`` (the parent of the run's nested calls)."""
        return f"mcp-{tool}-{next(self._calls)}"

    @contextlib.contextmanager
    def call(self) -> Iterator[None]:
        """Marks one tool call in flight (the idle sweep never ends a session with one)."""
        self.in_flight += 1
        self.last_used = time.monotonic()
        try:
            yield
        finally:
            self.in_flight -= 1
            self.last_used = time.monotonic()


class SessionScopes:
    """The scopes of the live MCP sessions of one front door.

    Args:
        client: The connected cellblock client.
        model_id: The model id passed to ``GetToolSurface`` (empty: unknown model).
    """

    def __init__(self, client: CellblockClient, model_id: str = "") -> None:
        self._client = client
        self._model_id = model_id
        self._scopes: dict[str, SessionScope] = {}
        self._opening: dict[str, asyncio.Task[SessionScope]] = {}

    def __len__(self) -> int:
        return len(self._scopes)

    def get(self, key: str) -> SessionScope | None:
        """The open scope of a session, or ``None``."""
        return self._scopes.get(key)

    async def open(self, key: str) -> SessionScope:
        """Returns the session's scope, registering it (once, also under concurrent requests).

        Raises:
            CodeModeNotEngagedError: The surface is not ``exec``/``wait`` for the model id.
            CellblockError: The service refused the registration or is unreachable.
        """
        existing = self._scopes.get(key)
        if existing is not None:
            existing.last_used = time.monotonic()
            return existing
        task = self._opening.get(key)
        if task is None:
            task = self._opening[key] = asyncio.ensure_future(self._register(key))
            task.add_done_callback(lambda _t: self._opening.pop(key, None))
        return await asyncio.shield(task)

    async def _register(self, key: str) -> SessionScope:
        scope = Scope(session_id=f"mcp-{key}-{secrets.token_hex(8)}", agent_run_id=AGENT_RUN_ID)
        await self._client.put_catalog(scope, [])
        try:
            surface = await self._client.tool_surface(scope, self._model_id)
            names = [t.name for t in surface.tools]
            if not surface.code_mode_engaged or names[:2] != list(CODE_MODE_TOOLS):
                raise CodeModeNotEngagedError(
                    f"the cellblock service does not engage code mode for model id {self._model_id!r} (tools: {names}): "
                    "it needs at least one hosted MCP server (CELLBLOCK_MCP_SERVERS) and either "
                    'CELLBLOCK_CODE_MODE {"enabled": true} or a preferred-tier model id (--model)'
                )
        except BaseException:
            with contextlib.suppress(CellblockError):
                await self._client.delete_catalog(scope)
            raise
        opened = SessionScope(key=key, scope=scope, tools=[t for t in surface.tools if t.name in CODE_MODE_TOOLS])
        self._scopes[key] = opened
        log.info("frontdoor.session_opened", session_id=scope.session_id, catalog_tools=len(surface.tools))
        return opened

    async def close(self, key: str, reason: str) -> None:
        """Ends one session's scope: aborts its legs and discards its suspended runs. Idempotent."""
        opened = self._scopes.pop(key, None)
        if opened is None:
            return
        try:
            ended = await self._client.delete_catalog(opened.scope)
            log.info(
                "frontdoor.session_closed",
                session_id=opened.scope.session_id,
                reason=reason,
                aborted_legs=ended.aborted_legs,
                discarded_runs=ended.discarded_runs,
            )
        except CellblockError as exc:
            log.warning("frontdoor.session_close_failed", session_id=opened.scope.session_id, reason=reason, error=str(exc))

    async def close_idle(self, idle_seconds: float) -> list[str]:
        """Ends the sessions with no call in flight and no request for ``idle_seconds``; returns their keys."""
        now = time.monotonic()
        idle = [k for k, s in self._scopes.items() if s.in_flight == 0 and now - s.last_used > idle_seconds]
        for key in idle:
            await self.close(key, "idle")
        return idle

    async def close_all(self, reason: str) -> None:
        """Ends every open session (front-door shutdown)."""
        for key in list(self._scopes):
            await self.close(key, reason)
