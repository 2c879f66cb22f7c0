"""`buf breaking` against proto/baseline.binpb catches wire-incompatible API changes.

The test copies proto/ to a temporary directory, checks that the unchanged copy passes,
then renumbers one field (a wire break) and expects `buf breaking` to fail naming it. It
uses the buf that `make npm-deps` installs (the repo root's package.json).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
BUF = ROOT / "node_modules" / ".bin" / "buf"


def _breaking(proto_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BUF), "breaking", "--against", "baseline.binpb"],
        cwd=proto_dir, capture_output=True, text=True, timeout=120, check=False,
    )


@pytest.fixture
def proto_copy(tmp_path: Path) -> Path:
    assert BUF.exists(), "buf is missing: run `make npm-deps`"
    copy = tmp_path / "proto"
    shutil.copytree(ROOT / "proto", copy, ignore=shutil.ignore_patterns("*_pb2*.py", "*_pb2*.pyi", "__pycache__"))
    return copy


def test_the_checked_in_protos_match_the_baseline(proto_copy: Path) -> None:
    result = _breaking(proto_copy)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_renumbered_field_fails_buf_breaking(proto_copy: Path) -> None:
    common = proto_copy / "cellblock" / "v1" / "common.proto"
    text = common.read_text(encoding="utf-8")
    changed = re.sub(r"string session_id = 1;", "string session_id = 3;", text, count=1)
    assert changed != text
    common.write_text(changed, encoding="utf-8")
    result = _breaking(proto_copy)
    assert result.returncode != 0, "buf breaking accepted a renumbered field"
    report = result.stdout + result.stderr
    assert "common.proto" in report and "session_id" in report, report


def test_a_removed_rpc_fails_buf_breaking(proto_copy: Path) -> None:
    runs = proto_copy / "cellblock" / "v1" / "run_service.proto"
    text = runs.read_text(encoding="utf-8")
    changed = text.replace("  rpc CancelRun(CancelRunRequest) returns (CancelRunResponse);\n", "")
    assert changed != text
    runs.write_text(changed, encoding="utf-8")
    result = _breaking(proto_copy)
    assert result.returncode != 0, "buf breaking accepted a removed RPC"
    assert "CancelRun" in result.stdout + result.stderr
