"""Operator configuration of cellblock-hosted MCP servers (SPEC §3.2 item 7).

``CELLBLOCK_MCP_SERVERS`` is a JSON object keyed by server name::

    {
      "memory": {"command": ["node", "/opt/mcp/server-memory/dist/index.js"],
                 "env": {"MEMORY_FILE_PATH": "/var/lib/cellblock/memory.jsonl"}},
      "time":   {"command": ["python", "-m", "mcp_server_time"]},
      "remote": {"url": "http://127.0.0.1:3001/mcp"}
    }

A server is either a stdio ``command`` (argv list, optional ``env`` merged over the SDK's
default environment and optional ``cwd``) or a streamable-HTTP ``url``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["McpServerConfig", "parse_mcp_servers"]

_BAD_NAME = re.compile(r"[:\s]")


@dataclass(frozen=True)
class McpServerConfig:
    """One hosted MCP server.

    Attributes:
        name: The server name: the ``owner`` of its catalog entries (trimmed, non-empty, no
            ``:`` or whitespace).
        command: Argv of a stdio server (empty for an HTTP server).
        env: Extra environment variables of a stdio server.
        cwd: Working directory of a stdio server, or ``None``.
        url: Streamable-HTTP endpoint (``http://`` or ``https://``), or ``""``.
    """

    name: str
    command: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    url: str = ""


def _server(name: Any, spec: Any) -> McpServerConfig:
    if not isinstance(name, str) or not name.strip() or _BAD_NAME.search(name.strip()):
        raise ValueError(f"MCP server name {name!r} must be non-empty without ':' or whitespace")
    name = name.strip()
    if not isinstance(spec, dict):
        raise ValueError(f"MCP server {name!r} must be an object with either command or url")
    unknown = set(spec) - {"command", "env", "cwd", "url"}
    if unknown:
        raise ValueError(f"MCP server {name!r} has unknown field(s): {', '.join(sorted(unknown))}")
    if ("command" in spec) == ("url" in spec):
        raise ValueError(f"MCP server {name!r} needs exactly one of command or url")
    if "url" in spec:
        url = spec["url"]
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ValueError(f"MCP server {name!r}: url must be an http:// or https:// URL")
        if "env" in spec or "cwd" in spec:
            raise ValueError(f"MCP server {name!r}: env and cwd apply only to command servers")
        return McpServerConfig(name=name, url=url)
    command = spec["command"]
    if not isinstance(command, list) or not command or not all(isinstance(a, str) and a for a in command):
        raise ValueError(f"MCP server {name!r}: command must be a non-empty list of non-empty strings")
    env = spec.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise ValueError(f"MCP server {name!r}: env must map strings to strings")
    cwd = spec.get("cwd")
    if cwd is not None and not isinstance(cwd, str):
        raise ValueError(f"MCP server {name!r}: cwd must be a string")
    return McpServerConfig(name=name, command=tuple(command), env=dict(env), cwd=cwd)


def parse_mcp_servers(value: str | Mapping[str, Any] | None) -> tuple[McpServerConfig, ...]:
    """Parses the hosted MCP server configuration.

    Args:
        value: JSON text (``CELLBLOCK_MCP_SERVERS``), an already parsed object, or
            ``None``/``""`` for none.

    Returns:
        The servers in name order.

    Raises:
        ValueError: Not JSON, not an object, or an invalid server entry (the message names it).
    """
    if value is None or value == "":
        return ()
    data = json.loads(value) if isinstance(value, str) else dict(value)
    if not isinstance(data, dict):
        raise ValueError("CELLBLOCK_MCP_SERVERS must be a JSON object keyed by server name")
    servers = [_server(name, spec) for name, spec in data.items()]
    names = [s.name for s in servers]
    if len(set(names)) != len(names):
        raise ValueError("MCP server names must be unique after trimming")
    return tuple(sorted(servers, key=lambda s: s.name))
