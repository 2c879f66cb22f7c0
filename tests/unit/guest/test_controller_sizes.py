"""The controller refuses a value the host would not read before writing it out (SPEC §9 rule 6, [B22]).

A final value over the bridge message bound, or a bridge request argument over
the reply inbox, is refused in the cell as soon as its size is known, so it is
never serialised whole, copied into Python or sent. In-process CellVM, real
controller.js.
"""

from __future__ import annotations

import json

import pytest

from tests.unit.guest.test_controller import LIMITS, run

INBOX = LIMITS["replyInboxBytes"]
#: max(maxOutputBytes, replyInboxBytes) + one bridge chunk (SPEC §2.3), with the test LIMITS.
BOUND = max(LIMITS["maxOutputBytes"], INBOX) + 1048576
REASON = f"its compact JSON is over {BOUND} bytes, more than the host reads from the cell, so return less data"


@pytest.mark.parametrize(
    "source",
    [
        f"return 'x'.repeat({BOUND - 1})",  # the fixed bug's shape: 'x'.repeat(60 MiB) ran 18 s into its refusal
        f"const s = 'x'.repeat({BOUND}); return {{a: [1, {{b: s}}]}}",
        f"return ['y'.repeat({BOUND // 2}), 'z'.repeat({BOUND // 2})]",
        f"return {{toJSON() {{ return 'w'.repeat({BOUND}); }}}}",
        f"return 'é'.repeat({BOUND // 2})",  # fewer chars than the bound, more UTF-8 bytes
        f"return {{['k'.repeat({BOUND})]: 1}}",  # a key: found on the finished text
    ],
)
def test_a_final_value_over_the_bridge_bound_is_refused_in_the_cell(source: str) -> None:
    status, _ = run(source, deadline_s=20.0)
    assert (status["phase"], status["reason"]) == ("unserialisable", REASON)
    assert "valueJson" not in status


def test_the_stringify_stops_at_the_first_string_that_passes_the_bound() -> None:
    # The getter after the big member never runs: nothing past the bound is written.
    source = f"const s = 'x'.repeat({BOUND}); return {{a: s, get b() {{ text('reached'); return 1; }}}}"
    status, sent = run(source, deadline_s=20.0)
    assert status["phase"] == "unserialisable"
    assert [i for i in sent if i[0] == "output"] == []


@pytest.mark.parametrize("extra", [0, 1])
def test_a_final_value_at_the_bound_completes_and_one_byte_more_is_refused(extra: int) -> None:
    status, _ = run(f"return 'x'.repeat({BOUND - 2 + extra})", deadline_s=20.0)
    if extra:
        assert status["reason"] == REASON
    else:
        assert status["phase"] == "fulfilled" and len(status["valueJson"]) == BOUND


def test_a_request_argument_over_the_inbox_is_refused_before_it_is_written() -> None:
    source = f"try {{ await tools.echo({{v: 'x'.repeat({INBOX})}}); }} catch (e) {{ return e.message; }}"
    status, sent = run(source, deadline_s=20.0)
    assert json.loads(status["valueJson"]) == f"this callValue request is over {INBOX} bytes, more than the bridge accepts ({INBOX} bytes); send less data."
    assert [i[4] for i in sent if i[0] == "request"] == ["too_large"]


def test_a_request_just_over_the_inbox_with_its_array_keeps_its_exact_size() -> None:
    # The argument fits alone; the request's array ([...]) takes it over: measured exactly as before.
    source = f"try {{ await tools.echo('x'.repeat({INBOX - 2})); }} catch (e) {{ return e.message; }}"
    status, _ = run(source, deadline_s=20.0)
    message = json.loads(status["valueJson"])
    assert message.startswith("this callValue request is ") and message.endswith(f"more than the bridge accepts ({INBOX} bytes); send less data.")
    assert "request is over" not in message
