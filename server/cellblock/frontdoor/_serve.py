"""The front door's transports: stdio and streamable HTTP (SPEC §3.7 item 2).

stdio is one session for the life of the process. Streamable HTTP is served by the
SDK's session manager (stateful: ``Mcp-Session-Id``) under uvicorn; a session's scope
ends when the client deletes the session (``DELETE``), after
``session_idle_seconds`` without a request and with no call in flight (the SDK's own
idle rule, so both forget a session together), or at shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
from collections.abc import AsyncIterator, Iterator
from typing import Any, cast

import structlog
import uvicorn
from mcp.server.stdio import stdio_server
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from cellblock.client import CellblockClient
from cellblock.frontdoor._door import FrontDoor, http_session, stdio_session

__all__ = ["DEFAULT_SESSION_IDLE_S", "serve_http", "serve_stdio"]

log = structlog.get_logger("cellblock.frontdoor")

#: Seconds an HTTP session may stay without requests before it (and its scope) ends.
DEFAULT_SESSION_IDLE_S = 30 * 60.0


#: Seconds uvicorn waits at shutdown for open HTTP connections (a connected client's standing GET
#: stream never closes on its own, and the SDK's sessions end only after it) before cancelling them.
SHUTDOWN_GRACE_S = 3

#: Longest stdio message (one JSON-RPC line) in bytes, as the gRPC API's message cap; a longer one ends the connection.
MAX_STDIO_LINE_BYTES = 64 * 1024 * 1024


class _StdinLines:
    """The lines of the MCP client's pipe, read on the event loop (so cancellable), for ``stdio_server``."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self._reader = reader

    def __aiter__(self) -> _StdinLines:
        return self

    async def __anext__(self) -> str:
        line = await self._reader.readline()
        if not line:
            raise StopAsyncIteration
        return line.decode("utf-8", errors="replace")


@contextlib.asynccontextmanager
async def _claimed_stdin() -> AsyncIterator[_StdinLines | None]:
    """Moves the client's pipe off fd 0 (which then reads /dev/null) onto an asyncio pipe reader.

    The SDK's own stdin reader is a worker thread that no cancellation reaches, so SIGTERM
    would wait for the client's next line. Yields ``None`` when fd 0 is not a pipe, socket or
    character device (then the SDK reads it as usual).
    """
    mode = os.fstat(0).st_mode
    if not (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or stat.S_ISCHR(mode)):
        yield None
        return
    wire = os.fdopen(os.dup(0), "rb", buffering=0)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    reader = asyncio.StreamReader(limit=MAX_STDIO_LINE_BYTES)
    transport, _ = await asyncio.get_running_loop().connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), wire)
    try:
        yield _StdinLines(reader)
    finally:
        transport.close()


async def serve_stdio(client: CellblockClient, *, model_id: str = "") -> None:
    """Serves MCP on this process's stdin/stdout until stdin closes (or cancellation)."""
    door = FrontDoor(client, stdio_session, model_id=model_id)
    try:
        async with _claimed_stdin() as lines, stdio_server(stdin=cast("Any", lines)) as (read_stream, write_stream):
            log.info("frontdoor.listening", transport="stdio")
            await door.server.run(read_stream, write_stream, door.server.create_initialization_options())
    except* (BrokenPipeError, ConnectionResetError):
        # The client is gone (it closed stdout, e.g. it died mid-leg): the ordinary end of a stdio server.
        log.info("frontdoor.stdio_client_gone")
    finally:
        await door.sessions.close_all("stdio closed")


class _SessionEnds:
    """ASGI wrapper: ends a session's scope once the SDK accepted its ``DELETE``."""

    def __init__(self, app: ASGIApp, door: FrontDoor) -> None:
        self._app = app
        self._door = door

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "DELETE":
            await self._app(scope, receive, send)
            return
        key = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"mcp-session-id"), None)
        status = 0

        async def watch(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        await self._app(scope, receive, watch)
        if key and 200 <= status < 300:
            await self._door.sessions.close(key, "session deleted")


class _Uvicorn(uvicorn.Server):
    """uvicorn without its own signal handlers: the caller owns SIGTERM/SIGINT (one process may also serve gRPC)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def serve_http(
    client: CellblockClient,
    *,
    host: str = "127.0.0.1",
    port: int = 8765,
    path: str = "/mcp",
    model_id: str = "",
    session_idle_seconds: float = DEFAULT_SESSION_IDLE_S,
    stop: asyncio.Event | None = None,
) -> None:
    """Serves MCP over streamable HTTP at ``http://host:port/path`` until ``stop`` is set.

    Args:
        client: The connected cellblock client.
        host: Listen host; loopback hosts get the SDK's DNS-rebinding protection.
        port: Listen port.
        path: The MCP endpoint path.
        model_id: The model id for ``GetToolSurface``.
        session_idle_seconds: Idle time after which a session and its scope end.
        stop: Set to shut down gracefully (uvicorn's own signal handling is off).
    """
    door = FrontDoor(client, http_session, model_id=model_id, handshake_only=True)
    app = door.server.streamable_http_app(streamable_http_path=path, host=host, session_idle_timeout=session_idle_seconds)
    config = uvicorn.Config(
        _SessionEnds(app, door), host=host, port=port, lifespan="on", log_config=None, access_log=False, timeout_graceful_shutdown=SHUTDOWN_GRACE_S
    )
    server = _Uvicorn(config)
    stop = stop or asyncio.Event()

    async def sweep() -> None:
        while True:
            await asyncio.sleep(min(60.0, session_idle_seconds / 2))
            await door.sessions.close_idle(session_idle_seconds)

    async def stopper() -> None:
        await stop.wait()
        # Sessions first (SPEC §3.7 item 8): their legs end aborted, so calls in flight get their answers
        # before uvicorn stops waiting for connections.
        await door.sessions.close_all("front door stopped")
        server.should_exit = True

    tasks: list[asyncio.Task[Any]] = [asyncio.ensure_future(sweep()), asyncio.ensure_future(stopper())]
    try:
        log.info("frontdoor.listening", transport="streamable-http", url=f"http://{host}:{port}{path}")
        await server.serve()
    finally:
        for task in tasks:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*tasks, return_exceptions=True)
        await door.sessions.close_all("front door stopped")
