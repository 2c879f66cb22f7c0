"""``python -m cellblock.server``: run the control service."""

from cellblock.server.app import main

main()
