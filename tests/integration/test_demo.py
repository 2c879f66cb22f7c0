"""``make demo`` fails when an example program does not complete (examples/demo.py).

Runs the real demo (a real service, real Docker cells) over a temporary programs
directory: the shipment program alone exits 0; beside a program that throws, 1.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from examples import demo


def _run_demo(monkeypatch: pytest.MonkeyPatch, programs: Path) -> int:
    monkeypatch.setattr(demo, "PROGRAMS_DIR", programs)
    return asyncio.run(demo.main())


@pytest.fixture()
def programs(tmp_path: Path) -> Path:
    shutil.copy(demo.PROGRAMS_DIR / "shipment.js", tmp_path / "shipment.js")
    return tmp_path


def test_demo_exits_0_when_every_program_completes(monkeypatch: pytest.MonkeyPatch, programs: Path) -> None:
    assert _run_demo(monkeypatch, programs) == 0


def test_demo_exits_1_when_a_program_fails(monkeypatch: pytest.MonkeyPatch, programs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (programs / "broken.js").write_text('throw new Error("this example is broken");\n', "utf-8")
    assert _run_demo(monkeypatch, programs) == 1
    assert "example programs that did not complete: broken.js" in capsys.readouterr().err
