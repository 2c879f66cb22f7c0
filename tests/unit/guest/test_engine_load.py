"""The precompiled QuickJS module is used only when it is exactly what the image build wrote (fail closed).

A cell maps the module's native code and runs it as it is, so a module that is
corrupt, compiled from another QuickJS wasm, or made for another wasmtime
engine must stop the cell before it attaches, with a clear error; it is never
loaded, and the cell does not quietly compile the wasm instead (DESIGN.md §3,
the guest agent's row). Each case runs in a fresh interpreter: the loaded
module is process-wide.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
from importlib.metadata import version

import pytest

from cellblock.guest import _engine_load

#: Loads the module the environment names and prints what happened.
_LOAD = """
from cellblock.guest._engine_load import EngineUnusableError, preload_engine
try:
    print("loaded" if preload_engine() else "not named")
except EngineUnusableError as exc:
    print("refused:", exc)
"""
#: A module serialized by an engine of another configuration (fuel metering changes the code).
_OTHER_ENGINE = """
import sys, wasmtime
from quickjs_rs import _engine
config = wasmtime.Config()
config.consume_fuel = True
module = wasmtime.Module(wasmtime.Engine(config), _engine._read_guest_wasm())
open(sys.argv[1], "wb").write(module.serialize())
"""


@pytest.fixture(scope="module")
def precompiled(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """A module precompiled the way the image build does it (``python -m cellblock.guest.precompile``)."""
    path = tmp_path_factory.mktemp("engine") / "quickjs.cwasm"
    subprocess.run([sys.executable, "-m", "cellblock.guest.precompile", str(path)], check=True, timeout=180)
    return path


def _load(path: pathlib.Path | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != _engine_load.PRECOMPILED_ENV}
    if path is not None:
        env[_engine_load.PRECOMPILED_ENV] = str(path)
    out = subprocess.run([sys.executable, "-c", _LOAD], env=env, check=True, timeout=180, capture_output=True, text=True)
    return out.stdout.strip()


def _copy(precompiled: pathlib.Path, into: pathlib.Path) -> pathlib.Path:
    path = into / "quickjs.cwasm"
    path.write_bytes(precompiled.read_bytes())
    pathlib.Path(f"{path}.json").write_text(pathlib.Path(f"{precompiled}.json").read_text())
    return path


def test_the_module_the_image_build_wrote_is_loaded(precompiled: pathlib.Path) -> None:
    recorded = json.loads(pathlib.Path(f"{precompiled}.json").read_text())
    assert set(recorded) == {"module_sha256", "guest_wasm_sha256"}
    assert _load(precompiled) == "loaded"


def test_without_a_named_module_the_engine_is_compiled_from_the_wasm() -> None:
    assert _load(None) == "not named"


def test_a_corrupt_module_is_refused(precompiled: pathlib.Path, tmp_path: pathlib.Path) -> None:
    path = _copy(precompiled, tmp_path)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit of the native code
    path.write_bytes(bytes(data))
    assert _load(path) == f"refused: the precompiled QuickJS module {path} is corrupt: its SHA-256 is not the one its image build recorded"


def test_a_missing_module_or_record_is_refused(precompiled: pathlib.Path, tmp_path: pathlib.Path) -> None:
    assert _load(tmp_path / "absent.cwasm").startswith(f"refused: the precompiled QuickJS module {tmp_path / 'absent.cwasm'} or its ")
    path = _copy(precompiled, tmp_path)
    pathlib.Path(f"{path}.json").unlink()
    assert _load(path).endswith("cannot be read (FileNotFoundError)")


def test_a_module_of_another_quickjs_wasm_is_refused(precompiled: pathlib.Path, tmp_path: pathlib.Path) -> None:
    path = _copy(precompiled, tmp_path)
    record = json.loads(pathlib.Path(f"{path}.json").read_text())
    pathlib.Path(f"{path}.json").write_text(json.dumps({**record, "guest_wasm_sha256": "00" * 32}))
    assert _load(path) == f"refused: the precompiled QuickJS module {path} was compiled from another QuickJS wasm than this cell's quickjs-rs"


def test_a_module_of_another_engine_configuration_is_refused_by_wasmtime(precompiled: pathlib.Path, tmp_path: pathlib.Path) -> None:
    path = _copy(precompiled, tmp_path)
    subprocess.run([sys.executable, "-c", _OTHER_ENGINE, str(path)], check=True, timeout=180)
    record = json.loads(pathlib.Path(f"{path}.json").read_text())
    # Its record matches it: only wasmtime's own compatibility check can refuse it.
    import hashlib

    pathlib.Path(f"{path}.json").write_text(json.dumps({**record, "module_sha256": hashlib.sha256(path.read_bytes()).hexdigest()}))
    assert _load(path).startswith(f"refused: wasmtime refused the precompiled QuickJS module {path} (another wasmtime version or engine configuration: ")


def test_the_agent_exits_before_it_connects_when_its_module_is_unusable(precompiled: pathlib.Path, tmp_path: pathlib.Path) -> None:
    path = _copy(precompiled, tmp_path)
    path.write_bytes(path.read_bytes()[:-1])
    env = {**os.environ, _engine_load.PRECOMPILED_ENV: str(path), "CELLBLOCK_BRIDGE_SOCKET": str(tmp_path / "no-bridge.sock"), "CELLBLOCK_CELL_TOKEN": "t"}
    out = subprocess.run([sys.executable, "-m", "cellblock.guest"], env=env, timeout=180, capture_output=True, text=True, check=False)
    assert out.returncode == 1
    assert out.stderr.strip() == f"cellblock-guest: the precompiled QuickJS module {path} is corrupt: its SHA-256 is not the one its image build recorded"


def test_the_build_id_reads_the_installed_versions() -> None:
    import quickjs_rs
    import wasmtime

    assert _engine_load._dist_version(quickjs_rs) == version("quickjs-rs")
    assert _engine_load._dist_version(wasmtime) == version("wasmtime")
    assert len(_engine_load.engine_build_id()) == 64
