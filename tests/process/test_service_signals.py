"""``python -m cellblock.server`` stops cleanly on SIGTERM sent the moment it says it is ready.

Readiness (``server.started``) is announced inside start-up; an orchestrator may send SIGTERM
right then. The service must stop cleanly (exit 0, ``server.stopping``), never die of the
signal's default action with its cells left behind (a clean-clone CI run saw exit -15).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.parametrize("attempt", range(3))
def test_sigterm_at_readiness_stops_the_service_cleanly(tmp_path: Path, attempt: int) -> None:
    root = Path(__file__).resolve().parents[2]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(str(root / p) for p in ("proto", "server", "client", "sandbox-image/guest")),
        "CELLBLOCK_EXECUTOR": "process",
        "CELLBLOCK_WARM_POOL": "1",
        "CELLBLOCK_SOCKET_DIR": str(tmp_path / "sockets"),
        "CELLBLOCK_STATE_DIR": str(tmp_path / "state"),
        "CELLBLOCK_ADDRESS": "127.0.0.1:0",
    }
    proc = subprocess.Popen([sys.executable, "-m", "cellblock.server"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # noqa: S603
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if "server.started" in line:
                proc.send_signal(signal.SIGTERM)
                break
        rest, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    output = "".join(lines) + rest
    assert proc.returncode == 0, output[-2000:]
    assert "server.stopping" in output
    assert list((tmp_path / "sockets").glob("cell-*")) == [], "a cell was left behind"
