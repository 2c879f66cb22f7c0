"""The cell's QuickJS engine: its wasmtime configuration, the module compiled at image build, the engine build id.

Every leg under ``CELLBLOCK_CELL_REUSE=leg`` starts a cell, so this module's
import and :func:`preload_engine` are on each cell's start-up path: they read
the package versions from the ``.dist-info`` directory names and the files
next to the packages directly (``importlib.metadata`` alone cost a cell about
10 ms of CPU), and hash the bundled QuickJS wasm once (bench/README.md).

The precompiled module (``python -m cellblock.guest.precompile PATH``, run at
image build) is native code that wasmtime maps and runs as it is, so the cell
loads it only when it is exactly what the image build wrote: a sidecar
``PATH.json`` records its SHA-256 and that of the QuickJS wasm it was compiled
from, and wasmtime itself refuses a module of another version or engine
configuration. When ``CELLBLOCK_PRECOMPILED_QUICKJS`` names a module (the
image's ``ENV``), any mismatch fails closed (:class:`EngineUnusableError`: the
agent exits before it attaches). Without the variable (the guest run on a
host, e.g. the process executor) the module is compiled from the bundled wasm.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os

import quickjs_rs
import wasmtime
from quickjs_rs import _engine, _wasmtime

#: wasmtime's limit for the wasm call stack, in bytes. The WASI build of
#: quickjs-ng has no stack check of its own, so recursion ends when this runs
#: out (an engine trap, R10, SPEC §10.10 item 2). wasmtime's default of 512 KiB
#: allows about 600 JavaScript frames; 2 MiB allows about 2,400 while the
#: engine's 1 MiB shadow stack (below its static data, so an overflow traps
#: too) stays the larger one for every recursion shape measured. It must stay
#: well below the agent thread's native stack (8 MiB).
MAX_WASM_STACK_BYTES = 2 * 1024 * 1024
#: Names the precompiled QuickJS module the cell must use (set by the image's Dockerfile).
PRECOMPILED_ENV = "CELLBLOCK_PRECOMPILED_QUICKJS"
#: Read at import: the agent drops its environment before it prepares a VM.
PRECOMPILED_MODULE = os.environ.get(PRECOMPILED_ENV, "")
_HERE = os.path.dirname(os.path.abspath(__file__))


class EngineUnusableError(RuntimeError):
    """The precompiled QuickJS module cannot be used: missing, corrupt, or built for another wasm or engine."""


def _install_engine() -> None:
    """Gives quickjs-rs (pinned 0.2.6) its shared wasmtime engine with our stack limit.

    Uses quickjs-rs internals: the shared engine is created lazily on first
    use, so setting it before any VM (or the precompile step) exists makes
    every instance, and the precompiled module, use this configuration.
    """
    if _wasmtime._SHARED_ENGINE is None:
        config = wasmtime.Config()
        config.max_wasm_stack = MAX_WASM_STACK_BYTES
        _wasmtime._SHARED_ENGINE = wasmtime.Engine(config)


_install_engine()


@functools.cache
def guest_wasm_digest() -> bytes:
    """SHA-256 of quickjs-rs's bundled QuickJS wasm (the file ``_engine._read_guest_wasm`` reads)."""
    with open(os.path.join(os.path.dirname(os.path.abspath(quickjs_rs.__file__)), "_guest.wasm"), "rb") as f:
        return hashlib.sha256(f.read()).digest()


def _dist_version(module: object) -> str:
    """The installed version of a top-level package, from its ``<name>-<version>.dist-info`` directory beside it.

    Raises:
        EngineUnusableError: No such directory (the build id cannot be made).
    """
    path = str(getattr(module, "__file__", ""))
    top = os.path.dirname(os.path.dirname(os.path.abspath(path)))
    prefix = getattr(module, "__name__", "") + "-"
    for name in os.listdir(top):
        if name.startswith(prefix) and name.endswith(".dist-info"):
            return name[len(prefix) : -len(".dist-info")]
    raise EngineUnusableError(f"no {prefix}*.dist-info beside {path}")


def _sidecar(path: str) -> str:
    return path + ".json"


def precompile(path: str) -> None:
    """Compiles the bundled QuickJS wasm; writes the serialized module to ``path`` and its digests to ``path.json``."""
    module = _engine._quickjs_artifact().module.serialize()
    with open(path, "wb") as f:
        f.write(module)
    with open(_sidecar(path), "w", encoding="utf-8") as f:
        json.dump({"module_sha256": hashlib.sha256(module).hexdigest(), "guest_wasm_sha256": guest_wasm_digest().hex()}, f)


def load_precompiled(path: str) -> None:
    """Loads the precompiled module at ``path`` into quickjs-rs's artifact cache (key ``"quickjs"``, pinned 0.2.6).

    Raises:
        EngineUnusableError: The module or its sidecar is missing or unreadable,
            the module's digest differs from the recorded one (corrupt), it was
            compiled from another QuickJS wasm, or wasmtime refuses it (another
            wasmtime version or engine configuration).
    """
    try:
        with open(_sidecar(path), encoding="utf-8") as f:
            recorded = json.load(f)
        with open(path, "rb") as f:
            module_digest = hashlib.sha256(f.read()).hexdigest()
    except (OSError, ValueError) as exc:
        raise EngineUnusableError(f"the precompiled QuickJS module {path} or its {_sidecar(path)} cannot be read ({exc.__class__.__name__})") from None
    if not isinstance(recorded, dict) or recorded.get("module_sha256") != module_digest:
        raise EngineUnusableError(f"the precompiled QuickJS module {path} is corrupt: its SHA-256 is not the one its image build recorded")
    if recorded.get("guest_wasm_sha256") != guest_wasm_digest().hex():
        raise EngineUnusableError(f"the precompiled QuickJS module {path} was compiled from another QuickJS wasm than this cell's quickjs-rs")
    engine = _wasmtime.shared_wasmtime_engine()
    try:
        module = wasmtime.Module.deserialize_file(engine, path)
    except wasmtime.WasmtimeError as exc:
        head = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else exc.__class__.__name__
        raise EngineUnusableError(f"wasmtime refused the precompiled QuickJS module {path} (another wasmtime version or engine configuration: {head})") from None
    _wasmtime._SHARED_ARTIFACTS["quickjs"] = _wasmtime.SharedWasmArtifact(module=module, linker=_engine._build_shared_linker(engine), build_id=guest_wasm_digest())


def preload_engine() -> bool:
    """Loads the precompiled module named by ``CELLBLOCK_PRECOMPILED_QUICKJS`` once per process.

    Returns:
        True when it was loaded now; False when the engine is already loaded
        or no module is named (quickjs-rs then compiles the bundled wasm).

    Raises:
        EngineUnusableError: The named module cannot be used (:func:`load_precompiled`).
    """
    if "quickjs" in _wasmtime._SHARED_ARTIFACTS or not PRECOMPILED_MODULE:
        return False
    load_precompiled(PRECOMPILED_MODULE)
    return True


def _read(name: str) -> bytes:
    with open(os.path.join(_HERE, name), "rb") as f:
        return f.read()


@functools.cache
def engine_build_id() -> str:
    """Hashes what decides whether a snapshot can be restored (SPEC §16.1 item 8), as hex.

    A snapshot is the VM's whole linear memory: the QuickJS wasm's heap layout
    and the controller's objects in it, plus ``_vm``'s and ``_image``'s framing
    and this module's engine configuration. So the id covers the bundled wasm, the
    quickjs-rs and wasmtime versions, the controller source and the sources of
    ``_vm``, ``_image`` and this module. Any rebuilt image that changes one of them gets a
    new id, and its cells refuse older snapshots (R19).
    """
    h = hashlib.sha256()
    h.update(guest_wasm_digest())
    for part in (
        f"quickjs-rs {_dist_version(quickjs_rs)} wasmtime {_dist_version(wasmtime)}".encode(),
        _read("controller.js"),
        _read("_vm.py"),
        _read("_image.py"),
        _read("_engine_load.py"),
    ):
        h.update(hashlib.sha256(part).digest())
    return h.hexdigest()


def controller_source() -> str:
    """The controller's source text."""
    return _read("controller.js").decode("utf-8")
