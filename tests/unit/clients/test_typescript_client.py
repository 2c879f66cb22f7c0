"""The TypeScript client's own tests (clients/typescript/src/client.test.ts).

Builds the client with its `tsc` (`tsc --strict`, tsconfig.json) and runs the compiled tests
with node. They need no service: an in-process gRPC server (connect-node) stands in for
cellblock where a test is about how the client answers nested calls.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
TS = ROOT / "clients" / "typescript"


def test_typescript_client_tests_pass() -> None:
    node, tsc = shutil.which("node"), TS / "node_modules" / ".bin" / "tsc"
    assert node and tsc.exists(), "node and the client's npm packages are needed: run `make client-deps`"
    subprocess.run([str(tsc), "-p", str(TS)], check=True, timeout=300)
    result = subprocess.run([node, str(TS / "dist" / "client.test.js")], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
