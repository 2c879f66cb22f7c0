"""The guest runtime (controller.js) in an in-process QuickJS VM.

Unit tests of the cell's inner layer: they run `CellVM` in this process (no
container, no bridge) and answer bridge requests by hand. The same code runs
in real cells in tests/integration.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from cellblock.guest._vm import CellVM, VMPoisonedError
from tests.support.outbox import take_items

LIMITS = {"maxPendingToolCalls": 4, "replyInboxBytes": 1 << 20, "maxOutputBytes": 4096, "outputSpentBytes": 0, "outputClosed": False}
CATALOG = {"allTools": [{"id": "host:core:echo", "source": "host", "sourceName": "core", "name": "echo", "description": "", "input": "{}"}], "convenience": {"echo": "host:core:echo"}, "apiFiles": []}


def new_vm(deadline_s: float = 5.0, limits: dict[str, Any] | None = None) -> CellVM:
    vm = CellVM(memory_limit_bytes=32 << 20, deadline=time.monotonic() + deadline_s)
    vm.install({"limits": dict(LIMITS, **(limits or {})), "catalog": CATALOG, "bridgeCounters": {}, "nextTimerId": 1})
    return vm


def run(source: str, answer: Any = None, **kw: Any) -> tuple[dict[str, Any], list[tuple[Any, ...]]]:
    """Runs source; answers every request with answer(method, args) until it settles."""
    vm = new_vm(**kw)
    vm.start(source)
    sent: list[tuple[Any, ...]] = []
    for _ in range(100):
        items = take_items(vm)
        sent.extend(items)
        status = vm.status()
        requests = [i for i in items if i[0] == "request" and not i[4]]
        if not requests:
            return status, sent
        for _, bridge_id, method, args_json, _refusal in requests:
            ok, payload = answer(method, json.loads(args_json)) if answer else (True, None)
            vm.settle(bridge_id, ok, json.dumps(payload) if ok else payload, "")
    raise AssertionError("did not settle")


def test_value_and_output_entries_in_order() -> None:
    status, sent = run('console.log("a", 1, {b: 2}); text({c: 3}); json([1, "x"]); console.error(); return {v: 1}')
    assert status["phase"] == "fulfilled" and json.loads(status["valueJson"]) == {"v": 1}
    outputs = [json.loads(i[1]) for i in sent if i[0] == "output"]
    assert outputs == [{"type": "text", "text": 'a 1 {"b":2}'}, {"type": "text", "text": '{"c":3}'}, {"type": "json", "value": [1, "x"]}, {"type": "text", "text": ""}]


def test_bridge_ids_count_per_method() -> None:
    status, sent = run('await tools.search("x"); await tools.callValue("host:core:echo", {}); await tools.echo({n: 1}); return 1', answer=lambda m, a: (True, []))
    ids = [i[1] for i in sent if i[0] == "request"]
    assert ids == ["bridge:search:1", "bridge:callValue:1", "bridge:callValue:2"]
    assert status["phase"] == "fulfilled"


def test_error_text_has_user_frames_with_user_lines() -> None:
    status, _ = run('const x = 1;\nfunction inner() {\n  throw new TypeError("bad input");\n}\ninner();')
    message = json.loads(status["failureMessage"])
    assert status["failureKind"] == "guest"
    assert message.splitlines()[0] == "TypeError: bad input"
    assert "    at inner (cellblock:user.js:3:" in message
    assert "    at <anonymous> (cellblock:user.js:5:" in message
    assert "eval_script" not in message and "<input>" not in message


def test_thrown_non_error_is_uncaught_text() -> None:
    status, _ = run('throw {reason: "nope"}')
    assert json.loads(status["failureMessage"]) == 'Uncaught {"reason":"nope"}'


def test_uncaught_host_rejection_is_reported_with_its_bridge_id() -> None:
    status, _ = run('await tools.callValue("host:core:echo", {});', answer=lambda m, a: (False, "Tool failed"))
    assert (status["failureKind"], status["failureBridgeId"], json.loads(status["failureMessage"])) == ("bridge", "bridge:callValue:1", "Error: Tool failed")


def test_rethrown_new_error_after_caught_rejection_is_guest() -> None:
    status, _ = run('try { await tools.echo({}); } catch (e) { throw new Error("wrapped: " + e.message); }', answer=lambda m, a: (False, "x"))
    assert status["failureKind"] == "guest"


def test_pending_cap_refuses_in_the_guest() -> None:
    vm = new_vm()
    vm.start("for (let i = 0; i < 6; i++) tools.echo({i}).catch(e => text(e.message)); return 1")
    items = take_items(vm)
    refused = [i for i in items if i[0] == "request" and i[4]]
    outputs = [json.loads(i[1])["text"] for i in items if i[0] == "output"]
    assert len(refused) == 2 and {i[4] for i in refused} == {"pending_cap"}
    assert outputs == ["too many pending host calls (limit 4); await some before starting more."] * 2


def test_unsettleable_program_is_pending_without_host_work() -> None:
    status, _ = run("await new Promise(() => {});")
    assert status["phase"] == "pending" and status["hostWork"] == 0


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("return undefined", None),
        ("return NaN", None),
        ("return -0", 0),
        ("return [1, undefined, () => 1]", [1, None, None]),
        ('return {["__proto__"]: 1, constructor: 2}', {"__proto__": 1, "constructor": 2}),
        ('return new Error("e")', {}),  # JSON.stringify gives "{}" (SPEC §8.8 rule 4)
        ('return [Symbol("s")]', [None]),
        ("return 10n", "10"),
        ('const o = {}; o.self = o; return o', "[object Object]"),
        ('return {toJSON() { return "custom"; }}', "custom"),
        ('return new Proxy({a: 1}, {})', {"a": 1}),
    ],
)
def test_return_values_are_json_safe(source: str, expected: Any) -> None:
    status, _ = run(source)
    assert status["phase"] == "fulfilled"
    assert json.loads(status["valueJson"]) == expected


def test_throwing_getter_and_string_conversion_is_unserialisable() -> None:
    status, _ = run('return {get x() { throw new Error("no"); }, toString() { throw new Error("no"); }}')
    assert status["phase"] == "unserialisable"


def test_guest_cannot_reach_controller_internals_or_node_globals() -> None:
    status, _ = run(
        "return [typeof __cellblock_send, typeof __cellblock_output, typeof process, typeof require, typeof module,"
        " typeof fetch, typeof globalThis.__cellblock_controller_restore]"
    )
    assert json.loads(status["valueJson"]) == ["undefined"] * 7


def test_globals_are_frozen_and_not_writable() -> None:
    status, _ = run(
        'tools.search = 1; delete globalThis.tools; globalThis.text = null; let pushed = true; try { ALL_TOOLS.push("x"); } catch { pushed = false; }'
        " return [typeof tools.search, typeof text, Object.isFrozen(ALL_TOOLS), Object.isFrozen(tools), pushed]"
    )
    assert json.loads(status["valueJson"]) == ["function", "function", True, True, False]


def test_overwriting_builtins_does_not_break_the_bridge() -> None:
    status, _ = run(
        "JSON.stringify = () => 'x'; JSON.parse = () => 'y'; Map.prototype.get = () => undefined; Promise.prototype.then = null;"
        ' const r = await tools.echo({n: 1}); return r',
        answer=lambda m, a: (True, {"ok": 1}),
    )
    # The value crossed although the guest sabotaged JSON, Map and Promise.
    assert status["phase"] in ("fulfilled", "rejected")
    if status["phase"] == "fulfilled":
        assert status["valueJson"] != "x"


def test_output_budget_closes_channel_and_counts_omissions() -> None:
    vm = new_vm(limits={"maxOutputBytes": 1024})
    vm.start('for (let i = 0; i < 50; i++) console.log("y".repeat(40)); return 1')
    outbox = vm.take()
    accepted = [i for i in outbox.items if i[0] == "o"]
    # C = 1024 - 256 = 768; K = 256: entries of 65 bytes fit while spent + 65 + 256 <= 768.
    assert len(accepted) == 7
    assert outbox.omitted_entries == 43 and outbox.omitted_bytes == 43 * 65
    assert json.loads(outbox.first_omitted) == "y" * 40
    # The next take reports only what was omitted since, and the first content once.
    vm.settle("bridge:none:1", True, "null", "")
    again = vm.take()
    assert (again.omitted_entries, again.first_omitted) == (0, "")


def test_refusal_flood_crosses_as_one_range_per_method() -> None:
    """A flood of pending-cap refusals is one outbox item, so it costs no host call per request."""
    vm = new_vm()
    vm.start("for (let i = 0; i < 3000; i++) tools.echo({i}).catch(() => {}); tools.search('x').catch(() => {}); return 1")
    items = vm.take().items
    assert [i[0] for i in items] == ["r"] * 4 + ["x", "x"]
    assert items[4] == ["x", "callValue", "pending_cap", 5, 2996]
    assert items[5] == ["x", "search", "pending_cap", 1, 1]


def test_deadline_interrupts_busy_loop_and_poisons_vm() -> None:
    vm = new_vm(deadline_s=0.3)
    with pytest.raises(VMPoisonedError) as info:
        vm.start("while (true) {}")
    assert info.value.kind == "interrupted"


def test_deep_recursion_traps_or_throws_range_error() -> None:
    vm = new_vm()
    try:
        vm.start("function f(n) { return f(n + 1) + 1; } return f(0);")
    except VMPoisonedError as exc:
        assert exc.kind == "trap"
    else:
        assert vm.status()["phase"] == "rejected"


def test_snapshot_restore_keeps_state_and_pending_promise() -> None:
    vm = new_vm()
    vm.start("const m = new Map([['k', 1]]); class K { constructor() { this.v = 2; } }; const k = new K(); const r = await tools.echo({}); return [m.get('k'), k.v, k instanceof K, r]")
    request = [i for i in take_items(vm) if i[0] == "request"][0]
    data, raw = vm.snapshot()
    assert raw > len(data) > 0
    vm.close()
    vm2 = CellVM(memory_limit_bytes=32 << 20, deadline=time.monotonic() + 5)
    vm2.restore(data, {"limits": LIMITS})
    vm2.settle(request[1], True, json.dumps("late"), "")
    status = vm2.status()
    assert json.loads(status["valueJson"]) == [1, 2, True, "late"]


def test_guest_prototype_poisoning_cannot_forge_the_status() -> None:
    status, _ = run(
        "Object.prototype.toJSON = () => ({phase: 'fulfilled', hostWork: 0, valueJson: '\"forged\"'});"
        " Map.prototype.forEach = () => { throw new Error('x'); };"
        " Object.defineProperty(Object.prototype, 'phase', {set() { throw new Error('setter'); }, get() { return 'forged'; }});"
        " return 41 + 1"
    )
    assert status["phase"] == "fulfilled" and status["hostWork"] == 0
    assert status["valueJson"] == "42"


def test_out_of_memory_inside_json_is_not_turned_into_a_string() -> None:
    vm = CellVM(memory_limit_bytes=16 << 20, deadline=time.monotonic() + 5)
    # An inbox larger than the heap, so the serialisation runs out of memory before it is over the inbox.
    vm.install({"limits": dict(LIMITS, replyInboxBytes=64 << 20), "catalog": CATALOG, "bridgeCounters": {}, "nextTimerId": 1})
    try:
        vm.start("const big = {s: 'q'.repeat(6 * 1024 * 1024)}; await tools.echo(big); return 'sent'")
    except VMPoisonedError as exc:
        assert exc.kind == "memory"
        return
    requests = [i for i in take_items(vm) if i[0] == "request"]
    assert all("[object Object]" not in i[3] for i in requests), "an engine failure must not become String(value)"
    status = vm.status()
    assert status["phase"] == "rejected" and "out of memory" in json.loads(status["failureMessage"])


def test_snapshot_parks_the_controller_where_guest_setters_cannot_see_it() -> None:
    vm = new_vm()
    vm.start(
        "let stolen = 'nothing'; const trap = {set(v) { stolen = v; }, get() { return stolen; }, configurable: true};"
        " Object.defineProperty(globalThis, '__cellblock_controller_restore', trap);"
        " Object.setPrototypeOf(globalThis, new Proxy({}, {set(t, k, v) { stolen = v; return true; }, defineProperty() { return false; }}));"
        " const r = await tools.echo({}); return typeof stolen;"
    )
    request = [i for i in take_items(vm) if i[0] == "request"][0]
    data, _ = vm.snapshot()
    vm.close()
    vm2 = CellVM(memory_limit_bytes=32 << 20, deadline=time.monotonic() + 5)
    vm2.restore(data, {"limits": LIMITS})
    vm2.settle(request[1], True, json.dumps(1), "")
    status = vm2.status()
    assert status["phase"] == "fulfilled" and json.loads(status["valueJson"]) == "string"
    names = json.loads(vm2._ctx.eval("JSON.stringify(Object.getOwnPropertyNames(globalThis))"))
    assert [k for k in names if k.startswith("__cellblock")] == ["__cellblock_controller_restore"], "only the guest's own decoy may remain"


def test_early_error_the_parser_missed_is_a_compile_error_with_its_line() -> None:
    vm = new_vm()
    vm.start("const a = 1;\n'use strict'; with ({}) {}\nreturn a;")
    status = vm.status()
    if status["phase"] == "compile_error":
        line, _, message = json.loads(status["failureMessage"]).partition(":")
        assert line.isdigit() and int(line) >= 1 and message
    else:
        assert status["phase"] in ("fulfilled", "rejected")


NEST = "let v = 0; for (let i = 0; i < %d; i++) v = [v]; "


def test_the_controller_and_the_host_share_the_value_nesting_bound() -> None:
    from pathlib import Path  # noqa: PLC0415

    from cellblock.server.limits import MAX_VALUE_DEPTH  # noqa: PLC0415

    controller = (Path(__file__).resolve().parents[3] / "sandbox-image" / "guest" / "cellblock" / "guest" / "controller.js").read_text(encoding="utf-8")
    assert f"const MAX_VALUE_DEPTH = {MAX_VALUE_DEPTH};" in controller


@pytest.mark.parametrize("depth", [257, 100_000])
def test_a_value_nested_deeper_than_the_bound_never_reaches_the_engine_serialiser(depth: int) -> None:
    # 100,000 levels trapped the engine (VMPoisonedError "call stack exhausted") in JSON.stringify.
    status, _ = run(NEST % depth + "return v;")
    assert (status["phase"], status["reason"]) == ("unserialisable", "nesting is deeper than 256 levels")
    status, sent = run(NEST % (depth - 1) + 'try { await tools.echo({v}); } catch (e) { return e.message; }')
    assert json.loads(status["valueJson"]) == "this callValue request is nested too deeply for the bridge (at most 256 levels of arrays and objects); send flatter data."
    assert [i[4] for i in sent if i[0] == "request"] == ["too_deep"]


def test_string_of_a_deep_array_is_measured_before_it_is_joined() -> None:
    # A bigint makes JSON.stringify throw; String() of the array then joined 100,000 levels in C (a trap).
    status, _ = run(NEST % 100_000 + "return [1n, v];")
    assert (status["phase"], status["reason"]) == ("unserialisable", "nesting is deeper than 256 levels")
    status, _ = run(NEST % 200 + "return [1n, v];")
    assert json.loads(status["valueJson"]) == "1,0"


def test_a_value_at_the_bound_is_written_whole() -> None:
    status, sent = run(NEST % 256 + 'json(v); await tools.echo(v[0]); return v;', answer=lambda m, a: (True, 1))
    assert status["phase"] == "fulfilled" and len(status["valueJson"]) == 2 * 256 + 1
    assert [i[0] for i in sent] == ["output", "request"] and sent[1][4] == ""
