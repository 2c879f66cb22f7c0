"""A misbehaving guest agent for tests: it starts and never attaches to its bridge.

It stands in for a cell stuck before its hello (a hung image entrypoint), so only the
host's attach timeout can end the leg.
"""

import time

time.sleep(3600)
