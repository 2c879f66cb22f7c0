"""``python -m cellblock.guest``: run one leg of a cell.

Every leg under ``CELLBLOCK_CELL_REUSE=leg`` starts a cell, so the agent's
start-up CPU is paid per leg (bench/README.md): the collector stays off while
the agent's modules load (their objects live as long as the process), and
Python's ``ssl`` module is never imported (the agent uses no Python TLS: the
TCP bridge's TLS is gRPC's own; asyncio runs without ``ssl``).
"""

import gc
import sys

gc.disable()
sys.modules["ssl"] = None  # type: ignore[assignment]  # makes `import ssl` raise ImportError

from cellblock.guest._agent import main  # noqa: E402 - after the two lines above, on purpose

# What the imports made is never collected: the collector skips it from now on.
gc.freeze()
gc.enable()
main()
