"""``python -m cellblock.guest``: run one leg of a cell."""

import os

# Read once when grpc initialises, so set before the agent imports it. The bridge
# client's socket is polled by grpc.aio's own poller thread (iomgr) instead of the
# EventEngine's poller and worker threads: one thread hand-off fewer for every
# message the host sends (the two-hop ping-pong's round trip 0.29 -> 0.26 ms with it
# in the cell end, five runs at load 35; bench/README.md "Nested calls, third pass").
os.environ.setdefault("GRPC_EXPERIMENTS", "-event_engine_client")

from cellblock.guest._agent import main  # noqa: E402 - after the grpc setting above

main()
