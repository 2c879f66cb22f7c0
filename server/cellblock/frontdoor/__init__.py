"""The MCP front door (SPEC §3.7): ``exec`` and ``wait`` for any MCP client.

A layer on top of cellblock's public API: it talks to the service only through
`cellblock.client` (an in-process service or a remote one), serves the model-facing
tools of ``GetToolSurface`` with the official MCP SDK (stdio and streamable HTTP),
and gives each MCP session its own scope. ``cellblock mcp`` (or
``python -m cellblock.frontdoor``) runs it.
"""

from cellblock.frontdoor._cli import build_parser, main, run_front_door
from cellblock.frontdoor._door import INSTRUCTIONS, FrontDoor, entry_json, http_session, stdio_session, tool_result
from cellblock.frontdoor._serve import DEFAULT_SESSION_IDLE_S, serve_http, serve_stdio
from cellblock.frontdoor._sessions import AGENT_RUN_ID, CodeModeNotEngagedError, SessionScope, SessionScopes

__all__ = [
    "AGENT_RUN_ID",
    "DEFAULT_SESSION_IDLE_S",
    "INSTRUCTIONS",
    "CodeModeNotEngagedError",
    "FrontDoor",
    "SessionScope",
    "SessionScopes",
    "build_parser",
    "entry_json",
    "http_session",
    "main",
    "run_front_door",
    "serve_http",
    "serve_stdio",
    "stdio_session",
    "tool_result",
]
