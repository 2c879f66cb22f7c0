"""``python -m cellblock.server.frontdoor [mcp options]``: the MCP front door (``cellblock mcp``)."""

import sys

from cellblock.server.frontdoor._cli import main

main(["mcp", *sys.argv[1:]])
