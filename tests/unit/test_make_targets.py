"""`make test-fast` installs what its tests run.

The unit tier builds and runs the generated clients (tests/unit/proto, tests/unit/clients: buf,
protoc, Go, tsc), so it needs `make client-deps`.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_test_fast_installs_the_client_toolchains() -> None:
    dry = subprocess.run(["make", "-n", "test-fast"], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True)
    assert "dpkg-query" in dry.stdout, "test-fast does not depend on client-deps (Go, protoc)"
    assert "npm ci" in dry.stdout, "test-fast does not depend on npm-deps (buf, tsc)"
