"""The direct controller calls of a nested call's path (``_crossings``) fail like quickjs-rs's own calls.

Guest code can run inside ``reportJson`` (a returned value's ``toJSON``) and ``settleText``
(a settled promise's callbacks run later, but a malformed settlement throws at once), so an
interrupt, memory exhaustion or a throw there must reach the VM's guard with the same class
as through ``Handle.call``: interrupted and out-of-memory VMs are poisoned, a throw is a
controller fault (the program's own error).
"""

from __future__ import annotations

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
