"""The checked-in generated code of every client is what proto/ generates today.

Runs `scripts/gen-proto.sh --out <tmp>` (Python, TypeScript and Go, the generators `make
client-deps` installs) and compares each generated file with the checkout, so a proto change
without `make proto` fails `make test`, not only `make proto-check`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
GENERATED = {
    "proto": ("*_pb2*.py", "*_pb2*.pyi"),
    "clients/typescript/src/gen": ("*.ts",),
    "clients/go/gen": ("*.go",),
}


def _files(base: Path) -> dict[str, bytes]:
    found: dict[str, bytes] = {}
    for folder, patterns in GENERATED.items():
        for pattern in patterns:
            for path in (base / folder).rglob(pattern):
                found[str(path.relative_to(base))] = path.read_bytes()
    return found


def test_generated_code_matches_the_protos(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHON=sys.executable)
    result = subprocess.run(
        [str(ROOT / "scripts" / "gen-proto.sh"), "--out", str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=300, check=False,
    )
    assert result.returncode == 0, f"gen-proto.sh failed (run `make client-deps`):\n{result.stderr}"
    fresh, checked_in = _files(tmp_path), _files(ROOT)
    assert fresh, "gen-proto.sh generated nothing"
    stale = sorted(name for name in fresh.keys() | checked_in.keys() if fresh.get(name) != checked_in.get(name))
    assert not stale, f"generated code is stale, run `make proto` and commit: {stale}"


def test_generation_accepts_a_relative_interpreter_path(tmp_path: Path) -> None:
    """The Makefile passes ``PYTHON=.venv/bin/python`` (relative); the script changes directory first."""
    relative = os.path.relpath(sys.executable, ROOT)
    env = dict(os.environ, PYTHON=relative)
    result = subprocess.run(
        [str(ROOT / "scripts" / "gen-proto.sh"), "--out", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False,
    )
    assert result.returncode == 0, f"gen-proto.sh failed with PYTHON={relative}:\n{result.stderr}"
    assert _files(tmp_path), "gen-proto.sh generated nothing"
