"""The engine crossings of a nested call's path, made directly.

Every call from Python into the QuickJS wasm instance (a *crossing*) costs tens
of microseconds in wasmtime-py, whatever the guest work. quickjs-rs's general
``Handle.call`` / ``to_python`` make about a dozen per controller call (a fresh
``this``, an out slot and an argv buffer allocated and freed, the result's type
read before its text, each argument converted on its own). A nested call's
settlement and the report after it are the same shape every time: one string
in, one string (or nothing) out. :class:`ControllerCalls` makes exactly the
crossings that shape needs, with a ``this`` value and out/argv slots allocated
once per VM.

Uses quickjs-rs internals (pinned 0.2.6, like ``_vm``): the instance's raw
export call ``c``, ``alloc_write`` (a text longer than the call buffer), the exports
``qjs_last_len``/``qjs_last_ptr``/``qjs_result_free`` of its result channel,
``take_exception`` and the context's ``_classify_jserror``. Errors are raised as quickjs-rs would raise them, so the
VM's guard classifies them the same way (JS error, trap, out of memory). The argument slot,
the out slot, the call buffer and the result text are read and written in the linear memory
directly (``ctypes``, bounds-checked against its current size like quickjs-rs's ``read``).

Most of a crossing's cost was not the engine but wasmtime-py's checked call:
it rebuilds the function's type, converts every argument and result through
``Val`` and unroots them, 20-30 µs per call. :class:`UncheckedExports` calls
the exports whose parameters and result are all ``i32`` (every export a nested
call uses) through wasmtime's ``wasmtime_func_call_unchecked`` with a raw value
buffer and the signature read once per export (pinned wasmtime 50.0.1).
"""

from __future__ import annotations

import ctypes
from typing import Any

import wasmtime
from quickjs_rs import JSError
from quickjs_rs import _engine as qjs_engine
from wasmtime import _ffi as wasmtime_ffi
from wasmtime._func import maybe_raise_last_exn

#: Bytes of the per-VM buffer a call's string argument is written into
#: (longer texts take an allocation of their own).
TEXT_BUFFER_BYTES = 4096
#: quickjs-rs status codes of its wasm exports (``_engine.STATUS_*``).
_STATUS_OK = 0
_STATUS_JS_ERROR = 1


class ControllerCalls:
    """Calls a controller method with at most one string argument.

    Creating it installs :class:`UncheckedExports` on the context's instance, so every
    later crossing of the VM (quickjs-rs's own too) skips wasmtime-py's checked call.

    Args:
        ctx: The VM's quickjs-rs context (its instance is ``ctx._engine_ctx._inst``).
    """

    def __init__(self, ctx: Any) -> None:
        self._ctx = ctx
        inst = ctx._engine_ctx._inst
        UncheckedExports(inst).install()
        self._inst = inst
        self._c = inst.c
        self._undefined = int(inst.c("new_undefined"))
        self._out = int(inst.c("qjs_alloc", 4))
        self._argv = int(inst.c("qjs_alloc", 4))
        # A nested call's settlement text is small: it is written into this
        # buffer, allocated once per VM, instead of an allocation and a free per call.
        self._text = int(inst.c("qjs_alloc", TEXT_BUFFER_BYTES))
        if self._text == 0:
            raise RuntimeError("the engine could not allocate the call buffer")

    def call(self, func: int, text: str | None, *, result: bool) -> str | None:
        """Calls ``func(text)`` (or ``func()``) with ``this`` undefined.

        Args:
            func: Raw engine handle of the function (kept alive by the caller).
            text: The one string argument, or ``None`` for none.
            result: Whether to read the result, which must then be a string.

        Returns:
            The result text, or ``None`` when ``result`` is False.

        Raises:
            quickjs_rs.JSError: The call threw (classified as ``Handle.call`` does:
                ``InterruptError``, ``MemoryLimitError``, ...).
            RuntimeError: ``result`` is set and the text cannot be read.
        """
        inst, c = self._inst, self._c
        argc = 0
        arg = 0
        if text is not None:
            data = text.encode()
            if len(data) <= TEXT_BUFFER_BYTES:
                ctypes.memmove(self._address(self._text, len(data)), data, len(data))
                arg = int(c("new_string", self._text, len(data)))
            else:
                ptr = inst.alloc_write(data)
                try:
                    arg = int(c("new_string", ptr, len(data)))
                finally:
                    c("qjs_free", ptr, len(data))
            ctypes.c_int32.from_address(self._address(self._argv, 4)).value = arg
            argc = 1
        try:
            status = c("call_function", func, self._undefined, self._argv, argc, self._out)
        finally:
            if argc:
                c("free_value", arg)
        if status == _STATUS_JS_ERROR:
            # The public class quickjs-rs's Handle.call would raise (interrupt,
            # out of memory, JS error), so the VM's guard classifies it alike.
            name, message, stack = inst.take_exception().args
            classified = self._ctx._classify_jserror(name, message, stack, None)
            raise classified from classified.__cause__
        if status != _STATUS_OK:
            raise JSError("Error", f"call status={status}", None)
        handle = ctypes.c_int32.from_address(self._address(self._out, 4)).value
        try:
            if not result:
                return None
            # Only the frozen controller's own methods are called here, and
            # each returns its captured JSON.stringify's text of a
            # prototype-less record: always a string, so reading it runs no
            # guest conversion. Callers still check the decoded shape.
            if c("get_string", handle) != _STATUS_OK:
                raise RuntimeError("the controller's text could not be read")
            length = int(c("qjs_last_len"))
            text_ptr = int(c("qjs_last_ptr")) if length else 0
            try:
                return ctypes.string_at(self._address(text_ptr, length), length).decode() if length else ""
            finally:
                c("qjs_result_free")
        finally:
            c("free_value", handle)

    def _address(self, ptr: int, length: int) -> int:
        """The host address of ``length`` bytes at ``ptr`` of the linear memory (bounds-checked, as quickjs-rs reads).

        Raises:
            RuntimeError: The range is outside the memory.
        """
        mem, store = self._inst.mem, self._inst.store
        if ptr < 0 or length < 0 or ptr + length > mem.data_len(store):
            raise RuntimeError(f"out-of-range engine memory access ptr={ptr} len={length}")
        return ctypes.addressof(mem.data_ptr(store).contents) + ptr

    def close(self) -> None:
        """Frees the slots and the ``this`` value (a poisoned engine may refuse)."""
        try:
            self._c("free_value", self._undefined)
            self._c("qjs_free", self._out, 4)
            self._c("qjs_free", self._argv, 4)
            self._c("qjs_free", self._text, TEXT_BUFFER_BYTES)
        except Exception:  # noqa: BLE001 - the engine is being released anyway
            pass


#: An export whose signature is not all-``i32`` (or not yet read): the checked call serves it.
_CHECKED = None


class UncheckedExports:
    """The instance's export call ``c`` without wasmtime-py's per-call type conversion.

    Install it with :meth:`install`: every ``inst.c(name, *args)`` of quickjs-rs
    (and of :class:`ControllerCalls`) then goes through :meth:`c`. An export is
    called unchecked only when its parameters and its result (at most one) are
    all ``i32`` and it gets exactly that many ``int`` arguments; an ``int`` is
    stored in the raw ``i32`` slot exactly as ``wasmtime.Val.i32`` stores it (wrapped
    to 32 bits). Anything else takes the checked call, which raises as before.
    Traps and host-callback exceptions surface as in the checked call
    (wasmtime's ``enter_wasm``, inlined), and the instance is published to quickjs-rs's host-import
    trampolines for the call like ``_Instance.c`` does.

    Args:
        inst: The quickjs-rs engine instance (``ctx._engine_ctx._inst``).
    """

    def __init__(self, inst: Any) -> None:
        self._inst = inst
        self._store = inst.store
        self._checked = inst.c
        self._signatures: dict[str, tuple[Any, int, int] | None] = {}

    def install(self) -> None:
        """Makes :meth:`c` the instance's export call."""
        self._inst.c = self.c

    def _signature(self, name: str) -> tuple[Any, int, int] | None:
        func = self._inst._exports[name]
        signature: tuple[Any, int, int] | None = _CHECKED
        if isinstance(func, wasmtime.Func):
            ty = func.type(self._store)
            params, results = ty.params, ty.results
            i32 = wasmtime.ValType.i32()
            if len(results) <= 1 and all(t == i32 for t in [*params, *results]):
                signature = (func, len(params), len(results))
        self._signatures[name] = signature
        return signature

    def c(self, name: str, *args: Any) -> Any:
        """Calls export ``name`` with ``args``; returns its ``i32`` result, or ``None`` when it has none."""
        signature = self._signatures[name] if name in self._signatures else self._signature(name)
        if signature is None or len(args) != signature[1] or not all(isinstance(a, int) for a in args):
            return self._checked(name, *args)
        func, n_params, n_results = signature
        size = max(n_params, n_results)
        values = (wasmtime_ffi.wasmtime_val_raw_t * max(size, 1))()
        for i, arg in enumerate(args):
            values[i].i32 = arg
        store = self._store
        previous = getattr(qjs_engine._CUR, "inst", None)
        qjs_engine._CUR.inst = self._inst
        # wasmtime's enter_wasm inlined (no generator context manager per crossing):
        # a trap is raised as a Trap, an error as a WasmtimeError, each after an
        # exception a host callback left (maybe_raise_last_exn) as there.
        trap = ctypes.POINTER(wasmtime_ffi.wasm_trap_t)()
        try:
            error = wasmtime_ffi.wasmtime_func_call_unchecked(store._context(), ctypes.byref(func._func), values, size, ctypes.byref(trap))
            if error:
                maybe_raise_last_exn()
                raise wasmtime.WasmtimeError._from_ptr(error)
            if trap:
                trap_obj = wasmtime.Trap._from_ptr(trap)
                maybe_raise_last_exn()
                raise trap_obj
        finally:
            qjs_engine._CUR.inst = previous
        return int(values[0].i32) if n_results else None
