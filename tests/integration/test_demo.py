"""``make demo`` fails when an example program does not complete (examples/demo.py).

Runs the real demo (a real service, real Docker cells) in its own process, as ``make demo``
does (it configures logging and tracing for the whole process), over a temporary programs
directory: the shipment program alone exits 0; beside a program that throws, 1.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from examples.data import PROGRAMS_DIR

ROOT = Path(__file__).resolve().parents[2]
_RUN = "import asyncio, sys; from pathlib import Path; from examples import demo; demo.PROGRAMS_DIR = Path(sys.argv[1]); sys.exit(asyncio.run(demo.main()))"


def _run_demo(programs: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(ROOT / p) for p in ("proto", "server", "client", "sandbox-image/guest", "."))}
    return subprocess.run([sys.executable, "-c", _RUN, str(programs)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)


@pytest.fixture()
def programs(tmp_path: Path) -> Path:
    shutil.copy(PROGRAMS_DIR / "shipment.js", tmp_path / "shipment.js")
    return tmp_path


def test_demo_exits_0_when_every_program_completes(programs: Path) -> None:
    done = _run_demo(programs)
    assert done.returncode == 0, done.stderr[-2000:]


def test_demo_exits_1_when_a_program_fails(programs: Path) -> None:
    (programs / "broken.js").write_text('throw new Error("this example is broken");\n', "utf-8")
    done = _run_demo(programs)
    assert done.returncode == 1, done.stderr[-2000:]
    assert "example programs that did not complete: broken.js" in done.stderr
