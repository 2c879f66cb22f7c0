"""Shared test configuration.

Integration tests use a real Docker engine and the real cell image (built by
`make image`, which `make test` runs first). They never fall back to the
process executor.
"""

from __future__ import annotations

import os

os.environ.setdefault("TESTCONTAINERS_RYUK_DISABLED", "true")
