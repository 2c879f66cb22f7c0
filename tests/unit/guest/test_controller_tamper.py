"""Tampered built-ins in an in-process VM: the controller keeps answering (issue 11 item 5, SPEC §8.1 item 5).

The inner layer of tests/integration/test_tenants_tamper.py: the same table of tamperings and
hostile values, run through `CellVM` with the agent's loop (answer tool calls and timers, snapshot
and restore at every park). No controller call may throw (`ControllerFaultError`) and the VM is
never poisoned: every program ends in a phase of its own (completed, rejected, unserialisable).
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from cellblock.guest._vm import CellVM, ControllerFaultError
from tests.support.outbox import take_items
from tests.support.tamperings import ENDINGS, PLACES, TAMPERINGS, VALUES, program

LIMITS = {"maxPendingToolCalls": 16, "replyInboxBytes": 1 << 20, "maxOutputBytes": 65536, "outputSpentBytes": 0, "outputClosed": False}
CATALOG = {"allTools": [], "convenience": {"echo": "host:core:echo"}, "apiFiles": []}


def _new_vm() -> CellVM:
    return CellVM(memory_limit_bytes=32 << 20, deadline=time.monotonic() + 10)


def _leg(vm: CellVM) -> tuple[str, Any]:
    """Runs the leg the way the guest agent does until it ends or parks on a yield."""
    for _ in range(50):
        requests = [i for i in take_items(vm) if i[0] == "request" and not i[4]]
        status = vm.status()
        phase = status["phase"]
        if phase == "fulfilled" and status["hostWork"] == 0:
            take_items(vm)
            return "completed", json.loads(status["valueJson"])
        if phase in ("rejected", "unserialisable"):
            return phase, status.get("failureMessage") or status.get("reason")
        assert phase != "pending" or status["hostWork"] > 0, "pending with no host work"
        for _, bridge_id, method, args_json, _ in requests:
            if method == "yield":
                return "park", bridge_id
            args = json.loads(args_json)
            vm.settle(bridge_id, True, json.dumps(args[1] if method == "callValue" else None), "")
    raise AssertionError("the leg did not end")


def _run(code: str) -> list[str]:
    """Every leg's phase of code, snapshotting and restoring the VM at each park."""
    vm = _new_vm()
    vm.install({"limits": LIMITS, "catalog": CATALOG, "bridgeCounters": {}, "nextTimerId": 1})
    vm.start(code)
    phases: list[str] = []
    try:
        for _ in range(3):
            phase, detail = _leg(vm)
            phases.append(phase)
            if phase != "park":
                return phases
            data, _ = vm.snapshot()
            vm.close()
            vm = _new_vm()
            vm.restore(data, {"limits": LIMITS})
            vm.settle(detail, True, json.dumps({"status": "resumed"}), "")
    finally:
        vm.close()
    raise AssertionError(f"too many parks: {phases}")


@pytest.mark.parametrize("name", list(TAMPERINGS))
def test_tampered_built_ins_never_break_the_controller(name: str) -> None:
    for place in PLACES:
        for ending, body in ENDINGS.items():
            phases = _run(program(TAMPERINGS[name], place, body))
            assert phases[-1] in ("completed", "rejected", "unserialisable"), (place, ending, phases)
            assert ending != "throw" or phases[-1] == "rejected", (place, ending, phases)


@pytest.mark.parametrize("name", list(VALUES))
def test_hostile_values_never_break_the_controller(name: str) -> None:
    for place in PLACES:
        code = f"await null;\n{VALUES[name]}" if place == "top level" else program("", place, VALUES[name])
        assert _run(code)[-1] in ("completed", "rejected", "unserialisable"), place


def test_a_frozen_global_object_still_parks_and_resumes() -> None:
    # The controller is found again by its handle, not by a property on globalThis.
    assert _run("Object.freeze(globalThis); const r = await yield_control('p'); return r.status;") == ["park", "completed"]


def test_a_throwing_controller_call_is_a_controller_fault_not_a_crash() -> None:
    # The agent maps this exception to a guest error (SPEC §8.1 item 5); a settle the
    # controller cannot parse is the one controller call that still throws on purpose.
    vm = _new_vm()
    vm.install({"limits": LIMITS, "catalog": CATALOG, "bridgeCounters": {}, "nextTimerId": 1})
    vm.start("return await tools.echo({});")
    request = [i for i in take_items(vm) if i[0] == "request"][0]
    with pytest.raises(ControllerFaultError) as caught:
        vm.settle(request[1], True, "{not json", "")
    assert caught.value.head.startswith("SyntaxError: ")
    vm.close()
