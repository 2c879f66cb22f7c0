"""``python -m cellblock.guest``: run one leg of a cell.

Every leg under ``CELLBLOCK_CELL_REUSE=leg`` starts a cell, so the agent's
start-up CPU is paid per leg (bench/README.md): the collector stays off while
the agent's modules load (their objects live as long as the process), and
Python's ``ssl`` module is never imported (the agent uses no Python TLS: the
TCP bridge's TLS is gRPC's own; asyncio runs without ``ssl``).
"""

import gc
import os
import sys

# Read once when grpc initialises, so set before the agent imports it. The bridge
# client's socket is polled by grpc.aio's own poller thread (iomgr) instead of the
# EventEngine's poller and worker threads: one thread hand-off fewer for every
# message the host sends (the two-hop ping-pong's round trip 0.29 -> 0.26 ms with it
# in the cell end, five runs at load 35; bench/README.md "Nested calls, third pass").
os.environ.setdefault("GRPC_EXPERIMENTS", "-event_engine_client")

gc.disable()
sys.modules["ssl"] = None  # type: ignore[assignment]  # makes `import ssl` raise ImportError

from cellblock.guest._agent import main  # noqa: E402 - after the lines above, on purpose

# What the imports made is never collected: the collector skips it from now on.
gc.freeze()
gc.enable()
main()
