"""The Go client's own package tests (`go test`, offline against Debian's Go sources).

`clients/go/build.sh --test` runs them in the same GOPATH mode the client builds in
(clients/README.md, "Go offline build"). They need no service: an in-process gRPC server
stands in for cellblock where a test is about the client's own stream handling.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_go_client_package_tests_pass() -> None:
    assert shutil.which("go"), "go is missing: run `make client-deps`"
    env = dict(os.environ, GOCACHE=os.environ.get("GOCACHE", str(ROOT / "build" / "go-cache")))
    result = subprocess.run(
        [str(ROOT / "clients" / "go" / "build.sh"), "--test"],
        env=env, capture_output=True, text=True, timeout=600, check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
