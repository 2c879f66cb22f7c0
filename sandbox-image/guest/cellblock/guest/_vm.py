"""The QuickJS VM of one cell: quickjs-rs on wasmtime, plus the controller.

Runs inside the cell only. The VM has no WASI preopens, no sockets and no host
functions: the controller queues bridge requests and output in its own outbox,
which the guest agent takes after each VM step (:meth:`CellVM.take`) and
forwards over the bridge.
"""

from __future__ import annotations

import functools
import json
import time
from dataclasses import dataclass, field
from typing import Any

import quickjs_rs
import wasmtime
from quickjs_rs import Runtime

from cellblock.guest import _engine_load
from cellblock.guest._crossings import ControllerCalls
from cellblock.guest._engine_load import preload_engine
from cellblock.guest._image import pack, prefault, unpack_into

USER_FILE = "cellblock:user.js"
# The user's source is compiled as the body of this function; the prefix sits
# on the source's first line, so line numbers stay exact and only columns of
# line 1 shift by its length.
_WRAPPER_PREFIX = "(async function __cellblock_main() {"
_WRAPPER_SUFFIX = "\n})"
#: Leads every snapshot this guest writes: magic, then the controller's handle
#: (4 bytes, big-endian), then the VM image as one zstd frame at level 1 (its
#: size in the frame header; 6x faster than zlib level 1 and smaller: bench/README.md).
_SNAPSHOT_MAGIC = b"CBS3"
_ZSTD_LEVEL = 1
#: Linear memory allowed above ``memoryLimitBytes`` (static data, stack, the
#: allocator's slack), in bytes.
WASM_HEADROOM_BYTES = 8 * 1024 * 1024


class VMPoisonedError(Exception):
    """The VM must be discarded: interrupted, out of memory or trapped.

    Attributes:
        kind: ``"interrupted"``, ``"memory"`` or ``"trap"``.
    """

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind
        self.detail = detail


class ControllerFaultError(Exception):
    """A controller call threw instead of answering.

    The controller captures every built-in it uses before user code runs, so
    only guest tampering the controller did not foresee can cause this: the
    leg then ends as the program's own error, never as a cell fault (SPEC
    §8.1 item 5).

    Attributes:
        head: ``<name>: <message>`` of the thrown value, at most 200 characters.
    """

    def __init__(self, head: str) -> None:
        super().__init__(head)
        self.head = head


@dataclass
class Outbox:
    """What the guest produced since the previous take, in program order.

    Attributes:
        items: ``["r", bridge_id, method, args_json]`` (a request),
            ``["o", entry_json]`` (an accepted output entry) or
            ``["x", method, refusal, first_n, count]`` (``count`` consecutive
            bridge ids of ``method`` refused by the controller).
        omitted_entries, omitted_bytes: Output entries omitted since the
            previous take and their compact-JSON size in bytes.
        first_omitted: The leg's first omitted content as a JSON string
            literal, only in the take that first saw an omission; else ``""``.
    """

    items: list[list[Any]] = field(default_factory=list)
    omitted_entries: int = 0
    omitted_bytes: int = 0
    first_omitted: str = ""


def engine_build_id() -> str:
    """Returns the hex engine build id that binds this cell's snapshots (:func:`._engine_load.engine_build_id`)."""
    preload_engine()
    return _engine_load.engine_build_id()


@functools.cache
def _controller_source() -> str:
    """The controller's source text (read once per process)."""
    return _engine_load.controller_source()


class CellVM:
    """One QuickJS VM with the cellblock controller installed.

    Args:
        memory_limit_bytes: Engine heap limit in bytes.
        deadline: Absolute ``time.monotonic()`` seconds after which guest code
            is interrupted (the VM is then poisoned).
    """

    def __init__(self, *, memory_limit_bytes: int, deadline: float) -> None:
        # The precompiled module first: a VM made before it is loaded would
        # compile the wasm itself (1-2 s under the cell's CPU quota).
        preload_engine()
        self.deadline = deadline
        self.interrupted = False
        self._runtime = Runtime(memory_limit=memory_limit_bytes, stack_limit=None)
        # Our own interrupt handler: it also records that it fired, because an
        # interrupted VM is never snapshotted or reused (SPEC §10.9 item 5).
        self._runtime._engine_rt.set_interrupt_handler(self._interrupt)
        self._ctx = self._runtime.new_context(timeout=3600.0)
        self.memory_limit_bytes = memory_limit_bytes
        # Second memory layer: wasmtime refuses to grow the linear memory past
        # the engine limit plus headroom, which also bounds the allocations the
        # engine's own accounting misses (large strings, array buffers).
        self._instance = self._ctx._engine_ctx._inst
        self._instance.store.set_limits(memory_size=memory_limit_bytes + WASM_HEADROOM_BYTES)
        self._ctrl: quickjs_rs.Handle | None = None
        self._factory: quickjs_rs.Handle | None = None
        self._methods: dict[str, quickjs_rs.Handle] = {}
        self._calls = ControllerCalls(self._ctx)

    @classmethod
    def prepared(cls, *, memory_limit_bytes: int) -> CellVM:
        """A VM made ahead of its leg (engine, callbacks, controller factory); no leg, no guest code in it yet.

        :meth:`install` then only calls the factory; the leg sets ``vm.deadline`` when it starts.
        """
        vm = cls(memory_limit_bytes=memory_limit_bytes, deadline=time.monotonic() + 3600.0)
        vm._factory = vm._guard(lambda: vm._ctx.eval_handle(_controller_source(), filename="cellblock:controller.js"))
        # While the cell waits in the pool: a resume's image is then written into
        # pages already faulted in (about 0.8 ms less of its CPU, bench/README.md).
        prefault(vm._instance)
        return vm

    def _interrupt(self) -> bool:
        if time.monotonic() >= self.deadline:
            self.interrupted = True
            return True
        return False

    # -- lifecycle --
    def install(self, config: dict[str, Any], catalog_json: str | None = None) -> None:
        """Evaluates the controller with ``config`` and keeps its handle.

        Args:
            config: The leg's configuration (``limits``, ``bridgeCounters``, ...).
            catalog_json: The guest catalog's JSON text as the host sent it (then
                not parsed here); ``None`` uses ``config["catalog"]``.
        """
        head = {key: value for key, value in config.items() if key != "catalog"}
        head.update(wrapperPrefix=_WRAPPER_PREFIX, wrapperSuffix=_WRAPPER_SUFFIX)
        catalog = json.dumps(config.get("catalog", {})) if catalog_json is None else catalog_json
        # One string for the controller (see its factory): compact JSON has no line feed.
        text = json.dumps(head, separators=(",", ":")) + "\n" + catalog
        factory = self._factory
        self._factory = None
        try:
            if factory is None:
                factory = self._guard(lambda: self._ctx.eval_handle(_controller_source(), filename="cellblock:controller.js"))
            self._ctrl = self._guard(lambda: factory.call(text))
        except ControllerFaultError as exc:
            # No guest code has run yet: this is the cell's own fault.
            raise RuntimeError(f"the controller did not install ({exc.head})") from None

    def start(self, source: str) -> None:
        """Compiles the user's program and starts it.

        Raises:
            ControllerFaultError: The controller threw (guest tampering).
            VMPoisonedError: The VM was interrupted, ran out of memory or trapped.
        """
        self._guard(lambda: self._calls.call(self._raw("start"), source, result=False))
        self.drain()

    def settle(self, bridge_id: str, ok: bool, payload: str, code: str) -> None:
        """Settles one bridge request and runs the job queue."""
        packed = json.dumps([bridge_id, ok, code], separators=(",", ":")) + "\n" + payload
        self._guard(lambda: self._calls.call(self._raw("settleText"), packed, result=False))
        self.drain()

    def drain(self) -> None:
        """Runs the job queue until nothing more can run.

        Raises:
            VMPoisonedError: Interrupted at the deadline, or the heap reached
                the memory limit (even when guest code caught the engine's
                out-of-memory error, SPEC §10.10 item 1).
        """
        engine_ctx = self._ctx._engine_ctx
        # The engine runs at most a batch of jobs per call; a program that
        # keeps queueing jobs (`for (;;) await null`) is drained until the
        # queue is empty or the interrupt handler stops it at the deadline.
        while self._guard(engine_ctx.run_pending_jobs) > 0 and not self.interrupted:
            if self.linear_memory_bytes() >= self.memory_limit_bytes:
                break
        if self.interrupted:
            raise VMPoisonedError("interrupted", "deadline reached while computing")
        if self.linear_memory_bytes() >= self.memory_limit_bytes:
            raise VMPoisonedError("memory", f"linear memory reached {self.linear_memory_bytes()} bytes")

    def linear_memory_bytes(self) -> int:
        """Current size of the VM's WebAssembly linear memory in bytes (it never shrinks)."""
        return int(self._instance.mem.data_len(self._instance.store))

    def status(self) -> dict[str, Any]:
        """Returns the controller's view of the leg (phase, host work, ...); absent fields are left out."""
        return _reply(self._guard(lambda: self._controller("status").call().to_python()), _STATUS_FIELDS)

    def report(self) -> tuple[Outbox, dict[str, Any]]:
        """Takes the outbox and reads the status in one controller call (:meth:`take`, :meth:`status`, :meth:`take`).

        The outbox also holds what reading the status produced (a value's ``toJSON``), after the rest.
        """
        text = self._guard(lambda: self._calls.call(self._raw("reportJson"), None, result=True))
        value = json.loads(text) if isinstance(text, str) else None
        if not isinstance(value, list) or len(value) != 3:
            raise RuntimeError("the controller returned an invalid report")
        before, after = _outbox(_reply(value[0], _TAKE_FIELDS)), _outbox(_reply(value[2], _TAKE_FIELDS))
        before.items += after.items
        before.omitted_entries += after.omitted_entries
        before.omitted_bytes += after.omitted_bytes
        before.first_omitted = before.first_omitted or after.first_omitted
        return before, _reply(value[1], _STATUS_FIELDS)

    def take(self) -> Outbox:
        """Takes the controller's outbox (requests, output, omissions) and empties it."""
        text = self._guard(lambda: self._calls.call(self._raw("takeJson"), None, result=True))
        return _outbox(_reply(json.loads(text) if isinstance(text, str) else None, _TAKE_FIELDS))

    def salvage(self) -> Outbox:
        """Takes the outbox of a poisoned VM, if it can still answer.

        An interrupted VM gets a short grace past its deadline for this one
        call; a VM that cannot answer (trapped, or out of memory again) gives
        an empty outbox. Omissions it cannot report then never reach a result.
        """
        if self._ctrl is None:
            return Outbox()
        deadline, self.deadline = self.deadline, time.monotonic() + 0.25
        self.interrupted = False
        try:
            return self.take()
        except Exception:  # noqa: BLE001 - a poisoned VM may fail any call
            return Outbox()
        finally:
            self.deadline = deadline

    def snapshot(self) -> tuple[bytes, int]:
        """Serialises the whole VM memory, compressed.

        Returns:
            ``(compressed_bytes, raw_size_in_bytes)``.
        """
        assert self._ctrl is not None
        # The controller is reachable only through its handle, a slot in the
        # engine's handle table, which lives in the copied linear memory: the
        # restored heap hands it back by number. Nothing is placed where guest
        # code could see or block it (a frozen or non-extensible globalThis,
        # a guest accessor on the global object; SPEC §8.1 item 5).
        self._ctx._assert_snapshot_quiescent()  # as the engine's own create_snapshot
        frame, raw_size = pack(self._ctx._engine_ctx._inst, _ZSTD_LEVEL)
        return _SNAPSHOT_MAGIC + _controller_slot(self._ctrl).to_bytes(4, "big") + frame, raw_size

    def restore(self, compressed: bytes, config: dict[str, Any]) -> None:
        """Restores a snapshot made by :meth:`snapshot` and resumes the leg.

        Raises:
            ValueError: The snapshot is from another engine build or malformed.
        """
        if not compressed.startswith(_SNAPSHOT_MAGIC):
            raise ValueError("not a cellblock snapshot")
        start = len(_SNAPSHOT_MAGIC) + 4
        slot = int.from_bytes(compressed[len(_SNAPSHOT_MAGIC) : start], "big")
        self._factory = None  # the restored heap replaces the prepared one
        # Never more than a VM of this cell's size can hold (the frame names its size),
        # unpacked straight into the linear memory (no copies of the image on the way).
        unpack_into(self._ctx._engine_ctx._inst, memoryview(compressed)[start:], self.memory_limit_bytes + WASM_HEADROOM_BYTES)
        self._ctrl = _adopt_slot(self._ctx, slot)
        self._methods = {}
        limits = json.dumps({"limits": config["limits"]}, separators=(",", ":"))
        self._guard(lambda: self._controller("resume").call(limits))

    def close(self) -> None:
        """Releases the engine."""
        self._calls.close()
        try:
            self._runtime.close()
        except Exception:  # noqa: BLE001 - a poisoned engine may fail to close
            pass

    # -- helpers --
    def _controller(self, name: str) -> quickjs_rs.Handle:
        # The controller object is frozen: its methods never change, so each
        # handle is looked up once per controller (a restore brings a new one).
        assert self._ctrl is not None
        method = self._methods.get(name)
        if method is None:
            method = self._methods[name] = self._ctrl.get(name)
        return method

    def _raw(self, name: str) -> int:
        """The raw engine handle of a controller method (see :mod:`._crossings`)."""
        return int(self._controller(name)._require_live()._require_live())

    def _guard(self, fn: Any) -> Any:
        self._runtime._deadline = self.deadline
        try:
            return fn()
        except wasmtime.Trap as exc:
            if self.interrupted:
                raise VMPoisonedError("interrupted", "deadline reached while computing") from None
            raise VMPoisonedError("trap", str(exc).splitlines()[-1] if str(exc) else "trap") from None
        except quickjs_rs.MemoryLimitError as exc:
            raise VMPoisonedError("memory", str(exc)) from None
        except quickjs_rs.InterruptError:
            raise VMPoisonedError("interrupted", "deadline reached while computing") from None
        except quickjs_rs.JSError as exc:
            if self.interrupted:
                raise VMPoisonedError("interrupted", "deadline reached while computing") from None
            if "out of memory" in str(exc) or self.linear_memory_bytes() >= self.memory_limit_bytes:
                # The engine reports some refused allocations without a message
                # ("Error: null"); a heap at its limit tells them apart.
                raise VMPoisonedError("memory", str(exc)) from None
            raise ControllerFaultError(f"{exc.name}: {exc.message}"[:200]) from None
        finally:
            self._runtime._deadline = None


#: Field order of the controller's ``status`` and ``take`` replies (arrays of
#: primitives: see ``replyOf`` in controller.js).
_STATUS_FIELDS = ("phase", "hostWork", "failureKind", "failureMessage", "failureBridgeId", "valueJson", "reason")
_TAKE_FIELDS = ("items", "omittedEntries", "omittedBytes", "firstOmitted")


def _reply(values: Any, names: tuple[str, ...]) -> dict[str, Any]:
    """Names the fields of a controller reply, leaving out the absent (null) ones."""
    if not isinstance(values, list) or len(values) != len(names):
        raise RuntimeError("the controller returned an invalid reply")
    return {name: value for name, value in zip(names, values, strict=True) if value is not None}


def _controller_slot(handle: quickjs_rs.Handle) -> int:
    """The engine handle-table slot of ``handle`` (quickjs-rs 0.2.6 internals)."""
    return int(handle._require_live()._handle)


def _adopt_slot(ctx: quickjs_rs.Context, slot: int) -> quickjs_rs.Handle:
    """A handle for ``slot`` of a restored heap: the value it held when the snapshot was taken.

    Uses quickjs-rs 0.2.6 internals: its handles are slots in a table inside the
    guest's linear memory, which a whole-memory restore brings back unchanged.
    """
    from quickjs_rs import _engine

    engine_ctx = ctx._engine_ctx
    return quickjs_rs.Handle(ctx, _engine.QjsHandle._adopt(engine_ctx._inst, slot, context=engine_ctx))


def _outbox(taken: Any) -> Outbox:
    """Decodes the controller's ``take`` record (its ``items`` arrive as a JSON array, parsed with the reply)."""
    items = taken["items"]
    return Outbox(
        items=items if isinstance(items, list) else [],
        omitted_entries=int(taken["omittedEntries"]),
        omitted_bytes=int(taken["omittedBytes"]),
        first_omitted=str(taken["firstOmitted"]),
    )
