"""The direct controller calls of a nested call's path (``_crossings``) fail like quickjs-rs's own calls.

Guest code can run inside ``reportJson`` (a returned value's ``toJSON``) and ``settleText``
(a settled promise's callbacks run later, but a malformed settlement throws at once), so an
interrupt, memory exhaustion or a throw there must reach the VM's guard with the same class
as through ``Handle.call``: interrupted and out-of-memory VMs are poisoned, a throw is a
controller fault (the program's own error).
"""

from __future__ import annotations

import json
import time

import pytest

from cellblock.guest._vm import CellVM, ControllerFaultError, VMPoisonedError
from tests.unit.guest.test_controller import CATALOG, LIMITS

CONFIG = {"limits": LIMITS, "catalog": CATALOG, "bridgeCounters": {}, "nextTimerId": 1}


def _vm(deadline_s: float) -> CellVM:
    vm = CellVM(memory_limit_bytes=32 << 20, deadline=time.monotonic() + 30.0)
    vm.install(CONFIG)
    vm.deadline = time.monotonic() + deadline_s
    return vm


def test_a_report_that_runs_forever_is_interrupted() -> None:
    vm = _vm(0.5)
    vm.start("return {toJSON() { for (;;) {} }};")
    with pytest.raises(VMPoisonedError) as caught:
        vm.report()
    assert caught.value.kind == "interrupted"
    vm.close()


def test_a_report_reads_outbox_and_status_together() -> None:
    vm = _vm(5.0)
    vm.start("text('hi'); return await tools.echo({});")
    outbox, status = vm.report()
    assert status["phase"] == "pending" and status["hostWork"] == 1
    assert [item[0] for item in outbox.items] == ["o", "r"]
    request = outbox.items[1]
    vm.settle(request[1], True, '{"n": 2}', "")
    outbox, status = vm.report()
    assert status["phase"] == "fulfilled" and status["valueJson"] == '{"n":2}' and outbox.items == []
    vm.close()


def test_a_malformed_settlement_is_a_controller_fault() -> None:
    vm = _vm(5.0)
    vm.start("return await tools.echo({});")
    outbox, _ = vm.report()
    with pytest.raises(ControllerFaultError):
        vm.settle(outbox.items[0][1], True, "{not json", "")
    vm.close()


def test_a_report_carries_the_output_a_value_writes_while_it_is_read() -> None:
    # Serialising the final value runs its toJSON inside reportJson: what it writes
    # comes in the same report, after the rest, so the leg's end needs no further take.
    vm = _vm(5.0)
    vm.start("text('before'); return {toJSON() { text('while read'); return 7; }};")
    outbox, status = vm.report()
    assert status["phase"] == "fulfilled" and status["valueJson"] == "7"
    assert [(item[0], json.loads(item[1])["text"]) for item in outbox.items] == [("o", "before"), ("o", "while read")]
    assert vm.take().items == []
    vm.close()


def test_the_catalog_text_reaches_the_guest_as_sent() -> None:
    head = {key: value for key, value in CONFIG.items() if key != "catalog"}
    program = "return [Object.keys(tools).sort(), typeof tools.echo, Object.isFrozen(tools)];"
    values = []
    for install in (lambda vm: vm.install(CONFIG), lambda vm: vm.install(head, json.dumps(CATALOG))):
        vm = CellVM(memory_limit_bytes=32 << 20, deadline=time.monotonic() + 30.0)
        install(vm)
        vm.start(program)
        _, status = vm.report()
        values.append(status["valueJson"])
        vm.close()
    assert values[0] == values[1] and '"echo"' in values[0]


def test_a_catalog_text_that_is_no_json_fails_the_install() -> None:
    vm = CellVM(memory_limit_bytes=32 << 20, deadline=time.monotonic() + 30.0)
    with pytest.raises(RuntimeError, match="the controller did not install"):
        vm.install({key: value for key, value in CONFIG.items() if key != "catalog"}, '{"allTools": [')
    vm.close()


def test_settlements_on_either_side_of_the_call_buffer_arrive_whole() -> None:
    # A settlement text up to TEXT_BUFFER_BYTES goes through the VM's call buffer, a longer one
    # through an allocation of its own: both reach the guest unchanged (multi-byte text too).
    from cellblock.guest._crossings import TEXT_BUFFER_BYTES

    vm = _vm(10.0)
    vm.start("let out = []; for (let i = 0; i < 4; i++) { out.push((await tools.echo({})).s.length); } return out;")
    lengths = []
    for size in (TEXT_BUFFER_BYTES - 200, TEXT_BUFFER_BYTES + 10, 3 * TEXT_BUFFER_BYTES, 10):
        outbox, status = vm.report()
        assert status["phase"] == "pending"
        text = "é" * (size // 2)
        lengths.append(len(text))
        vm.settle(outbox.items[-1][1], True, json.dumps({"s": text}, ensure_ascii=False), "")
    _, status = vm.report()
    assert json.loads(status["valueJson"]) == lengths
    vm.close()
