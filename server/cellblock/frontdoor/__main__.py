"""``python -m cellblock.frontdoor [mcp options]``: the MCP front door (``cellblock mcp``)."""

import sys

from cellblock.frontdoor._cli import main

main(["mcp", *sys.argv[1:]])
