"""Bridge requests with polluted counters are rejected back to the guest at once (issue 11 item 5).

A request's counter is the ``<n>`` of its ``bridge:<method>:<n>`` id and, for a request the
controller refused itself, the range ``refused_count`` stretches it to (SPEC §8.2 item 2).
Both layers, in real locked-down cells:

* the hostile agent (``tests/support/fuzz_guest.py``) sends, for every method, every shape
  of polluted counter: each gets its [P02]/[P03] ``Settle`` back before the agent ends the
  leg (no watchdog), the leg then ends as the guest says, and the message after each
  polluted one is still read and answered (``tests/support/bridge_oracle.py`` documents
  each answer);
* a real QuickJS program that tries to pollute the controller's counters through the
  prototypes it can reach (``Object.prototype.<method>``, getters, ``Number.prototype``)
  across a park and a resume still gets every request answered as its own.

The last test keeps the fuzzer's other findings, one plan each: JSON with ``NaN`` in arguments,
output entries and final values, a suspension the host never asked for, arguments that are
no array; each now gets the answer SPEC §14.5 documents.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from cellblock.bridge.v1 import bridge_service_pb2 as pb
from cellblock.client import CellblockClient, LimitOverrides, Scope, Tool
from cellblock.server import messages as msg
from tests.support.bridge_oracle import METHODS, expect
from tests.support.fuzz_cells import TIMEOUT_MS, FuzzCells, check_leg

pytestmark = pytest.mark.asyncio(loop_scope="session")

#: Every shape of ``<n>`` that is no counter: zero, signs, leading zeros, decimals and exponents,
#: white space and line ends around it, other scripts' digits, 17 digits, hex, nothing, letters.
POLLUTED_N = ["0", "00", "01", "-1", "+1", "-0", "1.0", "1e3", " 1", "1 ", "1\n", "\n1", "\u0661", "\uff11", "1" + "0" * 16, "0x1", "", "one", "1:1"]
#: Arguments each method's request is admitted with (a yield parks the leg, so it comes last).
ARGS = {"search": '["echo"]', "describe": '["host:core:echo"]', "call": '["host:core:echo", {}]', "callValue": '["host:core:echo", {}]', "namespace": '["x", "y", {}]', "timer": "[0]", "yield": '["park"]'}


def _req(bridge_id: str, method: str, args: str = "[]", refusal: int = 0, refused_count: int = 0) -> bytes:
    return pb.AttachRequest(request=pb.GuestRequest(bridge_id=bridge_id, method=method, args_json=args, refusal=refusal, refused_count=refused_count)).SerializeToString()


def _polluted_plan() -> list[bytes]:
    plan: list[bytes] = []
    for method in [m for m in METHODS if m != "yield"] + ["yield"]:
        other = "search" if method != "search" else "call"
        for n in POLLUTED_N:
            plan.append(_req(f"bridge:{method}:{n}", method, ARGS[method]))  # P02
        plan.append(_req(f"bridge:{other}:1", method, ARGS[method]))  # P02: the id names another method
        plan.append(_req(f"Bridge:{method}:1", method, ARGS[method]))  # P02
        plan.append(_req(f"bridge:{method}:5", method, ARGS[method]))  # admitted
        plan.append(_req(f"bridge:{method}:5", method, ARGS[method]))  # P03: reused
        plan.append(_req(f"bridge:{method}:3", method, "", refusal=pb.GUEST_REFUSAL_PENDING_CAP))  # P03: a refused range below the counter
        plan.append(_req(f"bridge:{method}:5", method, "", refusal=pb.GUEST_REFUSAL_TOO_LARGE, refused_count=4))  # P03: starts at a used id
        plan.append(_req(f"bridge:{method}:{10**16 - 3}", method, "", refusal=pb.GUEST_REFUSAL_PENDING_CAP, refused_count=5))  # P02: runs past 16 digits
        plan.append(_req(f"bridge:{method}:6", method, "", refusal=pb.GUEST_REFUSAL_PENDING_CAP, refused_count=3))  # refused: 6..8, recorded
        plan.append(_req(f"bridge:{method}:7", method, "", refusal=pb.GUEST_REFUSAL_PENDING_CAP, refused_count=-4))  # P03: inside 6..8
        plan.append(_req(f"bridge:{method}:8", method, ARGS[method]))  # P03: 8 was refused, so used
        plan.append(_req(f"bridge:{method}:4", method, ARGS[method]))  # P03: below the counter, never sent before
        plan.append(_req(f"bridge:{method}:9", method, "not json"))  # P05
        plan.append(_req(f"bridge:{method}:9", method, '{"a": 1}'))  # P05
    plan.append(pb.AttachRequest(end=pb.LegEnd(completed=pb.Completed(value_json='{"done": true}'))).SerializeToString())
    return plan


async def test_every_polluted_counter_is_rejected_back_at_once(docker_client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    messages = _polluted_plan()
    async with FuzzCells.start(monkeypatch) as cells:
        expected = expect(messages, good_token=True, timeout_ms=TIMEOUT_MS, memory_limit_bytes=cells.memory_limit_bytes)
        kinds = [a.kind for a in expected.answers]
        assert kinds.count("P02") == 7 * (len(POLLUTED_N) + 3) and kinds.count("P03") == 7 * 6 and kinds.count("P05") == 7 * 2, kinds
        started = time.monotonic()
        leg = await cells.run(True, messages, expected)
        elapsed = time.monotonic() - started
    check_leg(expected, leg)
    # Before the end, the agent waited for every rejection; none waited for the watchdog.
    assert leg.result.status == "completed" and leg.result.value == {"done": True}, leg.result.raw_json
    assert elapsed < TIMEOUT_MS / 1000, f"the leg took {elapsed:.1f} s: an answer waited for the deadline"
    rejected = {(b, m) for b, ok, m in leg.agent if not ok}
    for method in METHODS:
        for n in POLLUTED_N:
            assert (f"bridge:{method}:{n}", msg.p02(f"bridge:{method}:{n}")) in rejected, (method, n)
        assert (f"bridge:{method}:5", msg.p03(f"bridge:{method}:5")) in rejected, method
        assert (f"bridge:{method}:3", msg.p03(f"bridge:{method}:3")) in rejected, method
        assert (f"bridge:{method}:{10**16 - 3}", msg.p02(f"bridge:{method}:{10**16 - 3}")) in rejected, method


#: Pollutes every place a counter could be read through: own and inherited properties named
#: after each method, getters that throw or count, and number coercion.
POLLUTE = """
for (const m of ['search', 'describe', 'call', 'callValue', 'namespace', 'yield', 'timer', 'bridgeCounters', 'counters']) {
  try { Object.defineProperty(Object.prototype, m, { get() { throw new Error('polluted ' + m); }, set(v) {}, configurable: true }); } catch (e) {}
}
try { Object.prototype.NaN = 1; Number.prototype.valueOf = () => 1e300; Number.prototype.toString = () => 'x'; } catch (e) {}
try { Object.defineProperty(Number, 'isFinite', { value: () => false }); Math.floor = () => -1; String = () => '0'; } catch (e) {}
"""
CALLS = """
const found = (await tools.search('echo')).length > 0;
const described = (await tools.describe('host:core:echo')).id;
const a = await tools.callValue('host:core:echo', { n: 1 });
const b = (await tools.call('host:core:echo', { n: 2 })).result.details;
await new Promise(r => setTimeout(r, 1));
"""


async def test_a_program_cannot_pollute_the_controller_counters(client: CellblockClient) -> None:
    scope = Scope("counters", "pollute")
    await client.put_catalog(scope, [Tool(source="host", owner="core", name="echo")])

    async def echo(tool_input: Any, call: Any) -> Any:
        return {"details": tool_input}

    code = POLLUTE + CALLS + "const parked = await yield_control('park');\n" + POLLUTE + CALLS.replace("const ", "const r") + "return [found, described, a, b, parked.status, rfound, rdescribed, ra, rb];"
    started = time.monotonic()
    result = await client.exec(scope, tool_call_id="p", code=code, handlers={"echo": echo}, limits=LimitOverrides(timeout_ms=8000))
    assert result.status == "waiting", result.raw_json
    result = await client.wait(scope, tool_call_id="p-w", run_id=result.run_id, handlers={"echo": echo})
    assert result.status == "completed", result.raw_json
    assert result.value == [True, "host:core:echo", {"n": 1}, {"n": 2}, "yielded", True, "host:core:echo", {"n": 1}, {"n": 2}], json.dumps(result.value)
    assert time.monotonic() - started < 30


def _end(**outcome: Any) -> bytes:
    return pb.AttachRequest(end=pb.LegEnd(**outcome)).SerializeToString()


def _output(entry_json: str) -> bytes:
    return pb.AttachRequest(output=pb.GuestOutput(entry_json=entry_json)).SerializeToString()


#: Findings of the fuzzer, each a plan: what is not JSON (RFC 8259 has no NaN or Infinity) and what the
#: host never asked for. Each ends as SPEC §14.5 documents, with the answers before it as documented.
FINDINGS = {
    # Was: the NaN entry shown as {"type": "json", "value": null}; the NaN arguments dispatched, then [B23].
    "NaN in arguments and output": (
        [_output('{"type": "json", "value": NaN}'), _output('{"type": "json", "value": 1}'), _req("bridge:callValue:1", "callValue", '["host:core:echo", {"a": NaN}]')],
        _end(completed=pb.Completed(value_json="2")),
        "completed",
    ),
    # Was: completed with the value NaN (shown as null).
    "a NaN value": ([], _end(completed=pb.Completed(value_json="NaN")), "R17"),
    # Was: the run parked with an empty snapshot, which no wait could restore.
    "a suspension nobody asked for": ([], _end(suspended=pb.Suspended(raw_bytes=0, snapshot_bytes=0)), "R17"),
    # Was: the bridge's reader stopped at the bytes, the stream stayed open, the leg waited for the watchdog (R06).
    "bytes that are no bridge message": ([_req("bridge:search:1", "search", '["echo"]')], b"&\x973\x13", "R17"),
    # Was: the arguments taken as [] and answered [B05] as if the guest had sent no id.
    "arguments that are no array": ([_req("bridge:callValue:1", "callValue", '{"id": "host:core:echo"}'), _req("bridge:search:1", "search", "null")], _end(completed=pb.Completed(value_json="3")), "completed"),
}


async def test_what_is_not_json_or_not_asked_for_gets_its_documented_answer(docker_client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    async with FuzzCells.start(monkeypatch) as cells:
        for name, (body, end, answer) in FINDINGS.items():
            messages = [*body, end]
            expected = expect(messages, good_token=True, timeout_ms=TIMEOUT_MS, memory_limit_bytes=cells.memory_limit_bytes)
            assert expected.end is not None and expected.end.answer == answer, (name, expected.end)
            started = time.monotonic()
            leg = await cells.run(True, messages, expected)
            check_leg(expected, leg)
            assert time.monotonic() - started < TIMEOUT_MS / 1000, f"{name}: the leg waited for its deadline"
            if name.startswith("NaN"):
                assert leg.output == [("json", None, 1)], leg.output
                assert (("bridge:callValue:1", False, msg.p05("bridge:callValue:1"))) in leg.agent, leg.agent


async def test_a_nan_value_just_over_its_message_allowance_is_no_json(docker_client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # A value whose Completed message (the text plus 4 bytes of framing) is over the final allowance
    # but whose text is not: the host parsed that text leniently, and NaN reached the caller as null.
    allowance = 65536  # maxOutputBytes, nothing spent
    async with FuzzCells.start(monkeypatch) as cells:
        for size in (allowance, allowance - 3):
            text = '[NaN,"' + "x" * (size - 8) + '"]'
            messages = [_end(completed=pb.Completed(value_json=text))]
            expected = expect(messages, good_token=True, timeout_ms=TIMEOUT_MS, memory_limit_bytes=cells.memory_limit_bytes)
            assert expected.end is not None and expected.end.answer == "R17", expected.end
            leg = await cells.run(True, messages, expected)
            check_leg(expected, leg)


#: Numbers in guest text the host read with int(): past Python's 4,300-digit limit, or a digit int()
#: refuses ("²" is one for str.isdigit), it raised ValueError while mapping the leg's end, and the leg
#: failed as "the service failed while running this leg".
NUMBERS_IN_GUEST_TEXT = {
    "a rejection naming an id of 5,000 digits": (
        pb.Failed(kind=pb.FAILURE_KIND_BRIDGE_REJECTION, message=json.dumps("boom"), rejection_bridge_id="bridge:call:" + "1" * 5000),
        "guest error",
        "boom",
    ),
    "a syntax error on line ²": (pb.Failed(kind=pb.FAILURE_KIND_SYNTAX, message=json.dumps("²:unexpected token")), "S02", msg.s02(1, 1, "unexpected token")),
    "a syntax error on a line of 5,000 digits": (pb.Failed(kind=pb.FAILURE_KIND_SYNTAX, message=json.dumps("9" * 5000 + ":x")), "S02", msg.s02(1, 1, "x")),
}


async def test_numbers_in_guest_text_are_read_within_bounds(docker_client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    async with FuzzCells.start(monkeypatch) as cells:
        for name, (failed, answer, error) in NUMBERS_IN_GUEST_TEXT.items():
            messages = [_req("bridge:call:" + "2" * 5000, "call", '["host:core:echo", {}]'), _end(failed=failed)]
            expected = expect(messages, good_token=True, timeout_ms=TIMEOUT_MS, memory_limit_bytes=cells.memory_limit_bytes)
            assert expected.end is not None and expected.end.answer == answer, (name, expected.end)
            leg = await cells.run(True, messages, expected)
            check_leg(expected, leg)
            assert leg.result.error == error, (name, leg.result.raw_json)
