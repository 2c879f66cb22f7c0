"""A VM's engine crossings skip wasmtime-py's checked call where the signature allows (``_crossings.UncheckedExports``).

The checked call (``wasmtime.Func.__call__``) rebuilds the export's type and converts every
value on each crossing, most of a nested call's cost in the cell. The unchecked call must
behave the same: same results, the same exceptions for a wrong call, traps and host-callback
errors raised as before.
"""

from __future__ import annotations

import functools
import time

import pytest
import wasmtime

from cellblock.guest._vm import CellVM, VMPoisonedError
from tests.unit.guest.test_controller import CATALOG, LIMITS

CONFIG = {"limits": LIMITS, "catalog": CATALOG, "bridgeCounters": {}, "nextTimerId": 1}


def _vm(deadline_s: float = 30.0) -> CellVM:
    vm = CellVM(memory_limit_bytes=32 << 20, deadline=time.monotonic() + 30.0)
    vm.install(CONFIG)
    vm.deadline = time.monotonic() + deadline_s
    return vm


def test_a_nested_call_makes_no_checked_crossing(monkeypatch: pytest.MonkeyPatch) -> None:
    vm = _vm()
    vm.start("let s = 0; for (let i = 0; i < 3; i++) { s += (await tools.echo({ n: i })).n; } return s;")
    outbox, _ = vm.report()
    checked: list[object] = []
    original = wasmtime.Func.__call__

    def spy(self: wasmtime.Func, *args: object) -> object:
        checked.append(args)
        return original(self, *args)

    monkeypatch.setattr(wasmtime.Func, "__call__", spy)
    for i in range(3):
        vm.settle(outbox.items[0][1], True, f'{{"n": {i + 1}}}', "")
        outbox, status = vm.report()
    assert status["phase"] == "fulfilled" and status["valueJson"] == "6"
    assert checked == []
    vm.close()


def test_results_match_the_checked_call() -> None:
    vm = _vm()
    inst = vm._instance
    # A string made and read back unchecked, then through the checked call.
    data = "héllo".encode()
    for call in (inst.c, functools.partial(type(inst).c, inst)):
        ptr = call("qjs_alloc", len(data))
        inst.mem.write(inst.store, data, ptr)
        handle = call("new_string", ptr, len(data))
        call("qjs_free", ptr, len(data))
        assert call("get_string", handle) == 0
        n = call("qjs_last_len")
        assert inst.read(call("qjs_last_ptr"), n) == data
        assert call("qjs_result_free") is None
        call("free_value", handle)
    vm.close()


def test_a_wrong_call_fails_as_before() -> None:
    vm = _vm()
    inst = vm._instance
    with pytest.raises(wasmtime.WasmtimeError, match="too few parameters"):
        inst.c("free_value")
    with pytest.raises(TypeError):
        inst.c("free_value", "not a handle")
    # An export that is not all-i32 takes the checked call (and still works).
    handle = inst.c("new_number", 7)
    inst.c("free_value", handle)
    vm.close()


def test_an_interrupt_inside_an_unchecked_drain_poisons_the_vm() -> None:
    # The engine's interrupt handler is a host import: it reaches this VM only if the
    # unchecked call published the instance to quickjs-rs's trampolines.
    vm = _vm(0.3)
    with pytest.raises(VMPoisonedError) as caught:
        vm.start("await null; for (;;) {}")
    assert caught.value.kind == "interrupted"
    vm.close()


def test_an_interrupt_inside_an_unchecked_settlement_poisons_the_vm() -> None:
    vm = _vm(1.0)
    vm.start("const r = await tools.echo({}); for (;;) {}")
    outbox, _ = vm.report()
    with pytest.raises(VMPoisonedError) as caught:
        vm.settle(outbox.items[0][1], True, "{}", "")
    assert caught.value.kind == "interrupted"
    vm.close()
