"""cellblock-hosted MCP servers (SPEC §3.2 item 7): configuration and the SDK client hub."""

from cellblock.server.mcp._config import McpServerConfig, parse_mcp_servers
from cellblock.server.mcp._hub import McpHub

__all__ = ["McpHub", "McpServerConfig", "parse_mcp_servers"]
