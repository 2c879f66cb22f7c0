"""``pip install .`` builds: the README's quickstart installs the ``cellblock`` console script from the checkout."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_wheel_builds_with_every_package_and_the_console_scripts(tmp_path: Path) -> None:
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--wheel-dir", str(tmp_path), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    (wheel,) = tmp_path.glob("cellblock-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for module in (
        "cellblock/v1/code_mode_service_pb2.py",
        "cellblock/bridge/v1/bridge_service_pb2.py",
        "cellblock/client/__init__.py",
        "cellblock/server/app.py",
        "cellblock/server/runs/__init__.py",
        "cellblock/frontdoor/_cli.py",
    ):
        assert module in names, f"{module} is missing from the wheel"
    (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    scripts = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "cellblock = cellblock.frontdoor:main" in scripts and "cellblock-trace = " in scripts, scripts
