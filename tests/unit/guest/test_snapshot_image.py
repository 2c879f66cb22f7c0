"""A VM's image packed from, and unpacked straight into, its linear memory (guest ``_image``).

The packed frame holds exactly what the engine's own snapshot holds. On a resume the
engine's header checks still apply, in its order and fail closed, and the frame must
hold exactly the image its header names; each bad case below is a snapshot the cell
must refuse (``ValueError``), and a good one must resume with its heap.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import pytest
import zstandard
from quickjs_rs import _engine

from cellblock.guest._vm import CellVM
from tests.unit.guest.test_prepared_vm import CONFIG

_PREFIX = 8  # b"CBS3" and the controller's slot
_HEAD = _engine._SNAP_HEADER


def _parked() -> tuple[bytes, str]:
    """A snapshot of a program waiting on one tool call, and that call's bridge id."""
    vm = CellVM.prepared(memory_limit_bytes=32 << 20)
    vm.install(CONFIG)
    vm.start("const rows = Array.from({length: 500}, (_, i) => 'row ' + i); const r = await tools.echo({n: 1}); return rows.length + r.n")
    request = vm.take().items[0]
    data, _raw = vm.snapshot()
    vm.close()
    return data, request[1]


def _repack(data: bytes, change: Callable[[bytearray], bytes | bytearray], *, content_size: bool = True) -> bytes:
    image = bytearray(zstandard.ZstdDecompressor().decompress(data[_PREFIX:]))
    return data[:_PREFIX] + zstandard.ZstdCompressor(level=1, write_content_size=content_size).compress(bytes(change(image)))


def _field(image: bytearray, index: int, value: object) -> bytearray:
    fields = list(_HEAD.unpack_from(image, 0))
    fields[index] = value
    _HEAD.pack_into(image, 0, *fields)
    return image


def test_the_packed_frame_holds_the_engines_own_snapshot() -> None:
    vm = CellVM.prepared(memory_limit_bytes=32 << 20)
    vm.install(CONFIG)
    vm.start("const rows = Array.from({length: 500}, (_, i) => 'row ' + i); await tools.echo({n: 1}); return rows.length")
    vm.take()
    data, raw_size = vm.snapshot()
    engine = vm._ctx.create_snapshot().to_bytes()
    vm.close()
    assert zstandard.ZstdDecompressor().decompress(data[_PREFIX:]) == engine
    assert raw_size == len(engine) and zstandard.frame_content_size(data[_PREFIX:]) == len(engine)


def test_a_snapshot_resumes_with_its_heap() -> None:
    data, bridge_id = _parked()
    vm = CellVM.prepared(memory_limit_bytes=32 << 20)
    vm.deadline = time.monotonic() + 5.0
    vm.restore(data, CONFIG)
    vm.settle(bridge_id, True, json.dumps({"n": 41}), "")
    status = vm.status()
    assert status["phase"] == "fulfilled" and json.loads(str(status["valueJson"])) == 541
    vm.close()


@pytest.mark.parametrize(
    ("case", "change", "content_size", "reason"),
    [
        ("another engine build", lambda im: _field(im, 2, bytes(32)), True, "another engine build"),
        ("another format", lambda im: _field(im, 1, 99), True, "no engine snapshot"),
        ("not an engine snapshot", lambda im: b"XXXX" + bytes(im[4:]), True, "no engine snapshot"),
        ("an image shorter than its header", lambda im: im[:-65536], True, "does not match"),
        ("a header naming more memory than the image", lambda im: _field(im, 3, _HEAD.unpack_from(im, 0)[3] + 65536), True, "does not match"),
        ("a stack pointer past the image", lambda im: _field(im, 4, 1 << 31), True, "does not match"),
        ("a frame that names no size", lambda im: im, False, "malformed"),
        ("a frame cut short", None, True, "shorter than its header"),
    ],
)
def test_a_bad_snapshot_is_refused(case: str, change: Callable[[bytearray], bytes | bytearray] | None, content_size: bool, reason: str) -> None:
    data, _bridge_id = _parked()
    bad = data[: len(data) - 1000] if change is None else _repack(data, change, content_size=content_size)
    vm = CellVM.prepared(memory_limit_bytes=32 << 20)
    with pytest.raises(ValueError, match=reason):
        vm.restore(bad, CONFIG)
    vm.close()


def _resident_pages(address: int, size: int) -> int:
    """How many of the 4 KiB pages at ``address`` are in memory (``mincore``)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    pages = (size + 4095) // 4096
    vec = (ctypes.c_ubyte * pages)()
    assert libc.mincore(address, size, vec) == 0, ctypes.get_errno()
    return sum(b & 1 for b in vec)


def test_a_prepared_vm_has_its_linear_memory_faulted_in_with_its_contents_unchanged() -> None:
    # What a resume writes lands in pages already faulted in (bench/README.md); prefault
    # itself must change neither the memory's size nor a byte of it.
    import ctypes

    from cellblock.guest._image import prefault

    vm = CellVM(memory_limit_bytes=32 << 20, deadline=time.monotonic() + 10)
    inst = vm._ctx._engine_ctx._inst
    size = inst.mem.data_len(inst.store)
    buffer = inst.mem.get_buffer_ptr(inst.store, size, 0)
    assert _resident_pages(ctypes.addressof(buffer), size) < size // 4096, "a fresh VM's memory is not all faulted in"
    before = bytes(memoryview(buffer).cast("B"))
    assert prefault(inst)
    assert inst.mem.data_len(inst.store) == size
    assert bytes(memoryview(buffer).cast("B")) == before
    vm.close()
    prepared = CellVM.prepared(memory_limit_bytes=32 << 20)
    inst = prepared._ctx._engine_ctx._inst
    size = inst.mem.data_len(inst.store)
    assert _resident_pages(ctypes.addressof(inst.mem.get_buffer_ptr(inst.store, size, 0)), size) == size // 4096
    data, bridge_id = _parked()
    prepared.restore(data, CONFIG)
    prepared.settle(bridge_id, True, json.dumps({"n": 2}), "")
    _outbox, status = prepared.report()
    assert (status["phase"], status.get("valueJson")) == ("fulfilled", "502")
    prepared.close()
