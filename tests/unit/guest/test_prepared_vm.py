"""A VM prepared before its leg (SPEC §15 item 3): the same controller, nothing of a leg in it.

The guest agent of a pooled cell prepares its VM ahead of the Start message
(engine instance, host callbacks, controller source evaluated). These tests run
that path in this process and check that a prepared VM behaves exactly like a
VM made at Start: same globals, same status, same snapshot round trip.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import time

from cellblock.guest._vm import CellVM
from tests.unit.guest.test_controller import CATALOG, LIMITS

CONFIG = {"limits": LIMITS, "catalog": CATALOG, "bridgeCounters": {}, "nextTimerId": 1}
PROBE = "return [typeof tools.echo, typeof __cellblock_controller, Object.keys(globalThis).length]"


def _finish(vm: CellVM) -> dict[str, object]:
    vm.start(PROBE)
    status = vm.status()
    vm.close()
    return status


def test_a_prepared_vm_runs_a_leg_like_a_fresh_one() -> None:
    prepared = CellVM.prepared(memory_limit_bytes=32 << 20)
    prepared.deadline = time.monotonic() + 5.0
    prepared.install(CONFIG)
    fresh = CellVM(memory_limit_bytes=32 << 20, deadline=time.monotonic() + 5.0)
    fresh.install(CONFIG)
    a, b = _finish(prepared), _finish(fresh)
    assert a["phase"] == "fulfilled" and a == b
    assert json.loads(str(a["valueJson"]))[:2] == ["function", "undefined"]


def test_the_deadline_is_the_legs_not_the_preparations() -> None:
    vm = CellVM.prepared(memory_limit_bytes=32 << 20)
    vm.deadline = time.monotonic() + 0.3
    vm.install(CONFIG)
    started = time.monotonic()
    try:
        vm.start("for (;;) {}")
    except Exception as exc:  # noqa: BLE001 - the poisoned VM is the point
        assert "interrupted" in str(exc)
    else:
        raise AssertionError("the loop must be interrupted at the leg's deadline")
    assert time.monotonic() - started < 3.0
    vm.close()


def test_a_snapshot_restores_into_a_prepared_vm() -> None:
    first = CellVM(memory_limit_bytes=32 << 20, deadline=time.monotonic() + 5.0)
    first.install(CONFIG)
    first.start("const r = await tools.echo({n: 1}); return r.n + 1")
    request = first.take().items[0]
    assert request[0] == "r"
    data, _raw = first.snapshot()
    first.close()
    second = CellVM.prepared(memory_limit_bytes=32 << 20)
    second.deadline = time.monotonic() + 5.0
    second.restore(data, CONFIG)
    second.settle(request[1], True, json.dumps({"n": 41}), "")
    status = second.status()
    assert status["phase"] == "fulfilled" and json.loads(str(status["valueJson"])) == 42
    second.close()


def test_a_snapshot_image_larger_than_the_cell_can_hold_is_refused_unpacked() -> None:
    # The image is one zstd frame that names its size: one over the VM's memory is refused
    # before it is unpacked, and bytes that are no frame are a malformed snapshot.
    import zstandard

    from cellblock.guest._vm import WASM_HEADROOM_BYTES

    vm = CellVM.prepared(memory_limit_bytes=32 << 20)
    header = b"CBS3" + (0).to_bytes(4, "big")
    bomb = header + zstandard.ZstdCompressor(level=1).compress(bytes((32 << 20) + WASM_HEADROOM_BYTES + 1))
    for snapshot in (bomb, header + b"not a frame"):
        try:
            vm.restore(snapshot, CONFIG)
        except ValueError as exc:
            assert "malformed" in str(exc)
        else:
            raise AssertionError("the snapshot must be refused")
    vm.close()


_PRELOAD_PROBE = """
import wasmtime
loaded = []
real = wasmtime.Module.deserialize_file
wasmtime.Module.deserialize_file = lambda engine, path: loaded.append(path) or real(engine, path)
from cellblock.guest._vm import CellVM
CellVM.prepared(memory_limit_bytes=32 << 20).close()
print(loaded)
"""


def test_a_prepared_vm_uses_the_precompiled_engine(tmp_path: pathlib.Path) -> None:
    """A VM prepared before the hello loads the precompiled QuickJS module.

    Compiling the wasm itself instead cost each pooled cell 1-2 s under its CPU quota.
    """
    module = tmp_path / "quickjs.cwasm"
    env = {**os.environ, "CELLBLOCK_PRECOMPILED_QUICKJS": str(module)}
    subprocess.run([sys.executable, "-m", "cellblock.guest.precompile", str(module)], env=env, check=True, timeout=120)
    out = subprocess.run([sys.executable, "-c", _PRELOAD_PROBE], env=env, check=True, timeout=120, capture_output=True, text=True)
    assert out.stdout.strip() == repr([str(module)])
