"""A VM's image packed from, and unpacked straight into, the engine's linear memory.

quickjs-rs's own ``create_snapshot`` and ``restore_snapshot`` move the whole
image as ``bytes``: a snapshot copies the memory out and again behind the
engine's header before zstd compresses it, and a restore copies the
decompressed image three times on the way in (sliced off its header, a
``bytearray`` of it, then the write): about 2 ms of each for the 1.7 MB image
of a 2000-row heap (bench/README.md). Here zstd reads the linear memory itself
(one frame: the engine's header, then the image, its size in the frame header)
and decompresses into it, after the same fail-closed header checks the engine
makes, in its order (magic, format version, build id, size, stack pointer);
the frame must then hold exactly the image the header names. A frame that
fails part-way has written part of the memory: the caller's VM is then
unusable (a failed restore ends the leg; its VM is never used again).

Writing into linear memory the process has not touched yet costs a page fault
per 4 KiB page (wasmtime maps a fresh instance's memory copy-on-write): about
as much CPU as zstd itself for the 1.7 MB image (bench/README.md).
:func:`prefault` populates a prepared VM's memory in one call while its cell
waits in the pool, and a restore populates the pages it grows the same way.
"""

from __future__ import annotations

import ctypes

import zstandard
from quickjs_rs import _engine

_PAGE = 65536
#: Linux 5.14+: fault a range in writable, in one system call, without changing its contents.
_MADV_POPULATE_WRITE = 23
_libc = ctypes.CDLL(None, use_errno=True)  # the interpreter's own libc
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_libc.madvise.restype = ctypes.c_int


def prefault(instance: _engine._Instance, start: int = 0) -> bool:
    """Faults ``instance``'s linear memory from ``start`` (bytes) to its end in, writable; contents unchanged.

    Only a speed-up: a kernel or sandbox without ``MADV_POPULATE_WRITE`` (before
    Linux 5.14, gVisor) refuses it, and the pages then fault in when written.

    Returns:
        True when the kernel populated the range.
    """
    memory, store = instance.mem, instance.store
    size = memory.data_len(store)
    if start >= size:
        return True
    base = ctypes.addressof(memory.get_buffer_ptr(store, size, 0))
    return bool(_libc.madvise(base + start, size - start, _MADV_POPULATE_WRITE) == 0)


def pack(instance: _engine._Instance, level: int) -> tuple[bytes, int]:
    """Compresses ``instance``'s engine snapshot (header, then the whole linear memory) into one zstd frame.

    The caller checks the context is quiescent first (the engine's own snapshot does).

    Args:
        instance: The engine instance to snapshot.
        level: The zstd level.

    Returns:
        ``(frame, raw_size)``: the frame (its content size in its header) and the size of the
        engine snapshot it holds, in bytes.
    """
    memory, store = instance.mem, instance.store
    size = memory.data_len(store)
    header = _engine._SNAP_HEADER.pack(_engine.SNAP_MAGIC, _engine.SNAP_FORMAT_VERSION, instance.build_id, size, instance.sp.value(store))
    image = memoryview(memory.get_buffer_ptr(store, size, 0)).cast("B")
    compressor = zstandard.ZstdCompressor(level=level).compressobj(size=len(header) + size)
    return compressor.compress(header) + compressor.compress(image) + compressor.flush(), len(header) + size


def unpack_into(instance: _engine._Instance, frame: memoryview, most_bytes: int) -> None:
    """Decompresses a snapshot's zstd frame into ``instance``'s linear memory and sets its stack pointer.

    Args:
        instance: The engine instance to restore (its linear memory and ``__stack_pointer``).
        frame: One zstd frame holding the engine's snapshot (its header, then the image).
        most_bytes: The largest image the cell's VM may hold (bytes); the frame names its
            size, checked before anything is unpacked.

    Raises:
        ValueError: The frame is malformed, larger than ``most_bytes``, or its snapshot is
            from another engine build or inconsistent with itself.
    """
    header_size = _engine._SNAP_HEADER.size
    try:
        size = zstandard.frame_content_size(frame)
        if not header_size <= size <= most_bytes:
            raise zstandard.ZstdError(f"an image of {size} bytes")
        reader = zstandard.ZstdDecompressor().stream_reader(frame)
        head = _read_exactly(reader, header_size)
        magic, fmt, build_id, mem_size, sp_val = _engine._SNAP_HEADER.unpack(head)
        if magic != _engine.SNAP_MAGIC or fmt != _engine.SNAP_FORMAT_VERSION:
            raise ValueError("the snapshot is no engine snapshot of this format")
        if build_id != instance.build_id:
            raise ValueError("the snapshot is from another engine build")
        if mem_size != size - header_size or sp_val > mem_size:
            raise ValueError("the snapshot's header does not match its image")
        memory, store = instance.mem, instance.store
        current = memory.data_len(store)
        if mem_size > current:
            memory.grow(store, (mem_size - current + _PAGE - 1) // _PAGE)
            prefault(instance, current)
        target = memoryview(memory.get_buffer_ptr(store, mem_size, 0)).cast("B")
        done = 0
        while done < mem_size:
            n = reader.readinto(target[done:])
            if n <= 0:
                raise ValueError("the snapshot's image is shorter than its header says")
            done += n
        if reader.read(1):
            raise ValueError("the snapshot's image is longer than its header says")
        instance.sp.set_value(store, sp_val)
    except zstandard.ZstdError as exc:
        raise ValueError(f"the snapshot's image is malformed ({exc})") from None


def _read_exactly(reader: zstandard.ZstdDecompressionReader, n: int) -> bytes:
    out = b""
    while len(out) < n:
        part = reader.read(n - len(out))
        if not part:
            raise ValueError("the snapshot's image is shorter than its header")
        out += part
    return out
