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
export call ``c``, ``alloc_write``, ``read_i32``, ``take_result``,
``take_exception`` and the context's ``_classify_jserror``. Errors are raised as quickjs-rs would raise them, so the
VM's guard classifies them the same way (JS error, trap, out of memory).
"""

from __future__ import annotations

import struct
from typing import Any

from quickjs_rs import JSError

#: quickjs-rs status codes of its wasm exports (``_engine.STATUS_*``).
_STATUS_OK = 0
_STATUS_JS_ERROR = 1


class ControllerCalls:
    """Calls a controller method with at most one string argument.

    Args:
        ctx: The VM's quickjs-rs context (its instance is ``ctx._engine_ctx._inst``).
    """

    def __init__(self, ctx: Any) -> None:
        self._ctx = ctx
        inst = ctx._engine_ctx._inst
        self._inst = inst
        self._c = inst.c
        self._undefined = int(inst.c("new_undefined"))
        self._out = int(inst.c("qjs_alloc", 4))
        self._argv = int(inst.c("qjs_alloc", 4))

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
            ptr = inst.alloc_write(data)
            try:
                arg = int(c("new_string", ptr, len(data)))
            finally:
                c("qjs_free", ptr, len(data))
            inst.mem.write(inst.store, struct.pack("<i", arg), self._argv)
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
        handle = inst.read_i32(self._out)
        try:
            if not result:
                return None
            # Only the frozen controller's own methods are called here, and
            # each returns its captured JSON.stringify's text of a
            # prototype-less record: always a string, so reading it runs no
            # guest conversion. Callers still check the decoded shape.
            if c("get_string", handle) != _STATUS_OK:
                raise RuntimeError("the controller's text could not be read")
            return bytes(inst.take_result()).decode()
        finally:
            c("free_value", handle)

    def close(self) -> None:
        """Frees the slots and the ``this`` value (a poisoned engine may refuse)."""
        try:
            self._c("free_value", self._undefined)
            self._c("qjs_free", self._out, 4)
            self._c("qjs_free", self._argv, 4)
        except Exception:  # noqa: BLE001 - the engine is being released anyway
            pass
