"""``pip install .`` builds: the README's quickstart installs the ``cellblock`` console script from the checkout."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_wheel_builds_with_every_package_and_the_console_scripts(tmp_path: Path) -> None:
    # A clean copy: setuptools' build/ folder in the checkout would carry packages of earlier builds.
    source = tmp_path / "src"
    for top in ("proto", "server", "client"):
        shutil.copytree(ROOT / top, source / top, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--wheel-dir", str(tmp_path), str(source)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    (wheel,) = tmp_path.glob("cellblock-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    # Every module of the checkout's packages (the explicit list in pyproject.toml must name new ones).
    sources = [f for top in ("proto", "server", "client") for f in (ROOT / top).glob("cellblock/**/*.py")]
    modules = {str(f.relative_to(f.parents[len(f.relative_to(ROOT).parts) - 2])) for f in sources}
    assert "cellblock/frontdoor/_cli.py" in modules and "cellblock/v1/code_mode_service_pb2.py" in modules
    assert modules - names == set(), "modules missing from the wheel (add their package to [tool.setuptools] packages)"
    (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    scripts = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "cellblock = cellblock.frontdoor:main" in scripts and "cellblock-trace = " in scripts, scripts
