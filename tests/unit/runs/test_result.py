"""Model-facing result objects (SPEC §10.5)."""

import pytest

from cellblock.server.runs._result import (
    completed_result,
    failed_result,
    input_failed_result,
    make_telemetry,
    waiting_result,
)

TELEMETRY = {
    "visibleTools": ["exec", "wait"],
    "counterScope": "0123456789ab",
    "callCount": 3,
    "describeCount": 2,
    "searchCount": 1,
    "sources": {"client": 1, "host": 4},
    "catalogSize": 5,
}
EXPECTED_TELEMETRY = {
    "catalogSize": 5,
    "sources": {"host": 4, "mcp": 0, "client": 1},
    "searchCount": 1,
    "describeCount": 2,
    "callCount": 3,
    "counterScope": "0123456789ab",
    "visibleTools": ["exec", "wait"],
}


def test_telemetry_key_order() -> None:
    telemetry = completed_result(value=1, output=[], replay_safe=False, telemetry=TELEMETRY)[
        "telemetry"
    ]
    assert telemetry == EXPECTED_TELEMETRY
    assert list(telemetry) == list(EXPECTED_TELEMETRY)
    assert list(telemetry["sources"]) == ["host", "mcp", "client"]
    assert make_telemetry() == {
        "catalogSize": 0,
        "sources": {"host": 0, "mcp": 0, "client": 0},
        "searchCount": 0,
        "describeCount": 0,
        "callCount": 0,
        "counterScope": "",
        "visibleTools": ["exec", "wait"],
    }


def test_completed() -> None:
    result = completed_result(
        value={"a": 1}, output=[{"type": "text", "text": "hi"}], replay_safe=True, telemetry=TELEMETRY
    )
    assert list(result) == ["status", "value", "output", "replaySafe", "telemetry"]
    assert result["status"] == "completed"
    assert result["output"] == [{"type": "text", "text": "hi"}]


@pytest.mark.parametrize(
    ("methods", "reason"),
    [(["yield"], "yield"), (["yield", "yield"], "yield"), (["yield", "timer"], "pending_tools")],
)
def test_waiting(methods: list[str], reason: str) -> None:
    pending = [(f"bridge:{method}:{i}", method) for i, method in enumerate(methods, 1)]
    result = waiting_result(
        run_id="run_" + "0" * 32, pending_tool_calls=pending, output=[], replay_safe=False,
        telemetry=TELEMETRY,
    )
    assert list(result) == [
        "status", "runId", "reason", "pendingToolCalls", "output", "replaySafe", "telemetry"
    ]
    assert result["reason"] == reason
    assert result["pendingToolCalls"][0] == {"id": "bridge:" + methods[0] + ":1", "method": methods[0]}
    assert list(result["pendingToolCalls"][0]) == ["id", "method"]


def test_waiting_needs_pending_requests() -> None:
    with pytest.raises(ValueError):
        waiting_result(run_id="run_x", pending_tool_calls=[], output=[], replay_safe=False, telemetry={})
    with pytest.raises(ValueError):
        waiting_result(
            run_id="run_x", pending_tool_calls=[("1", "fetch")], output=[], replay_safe=False,
            telemetry={},
        )


def test_failed() -> None:
    result = failed_result(
        error="Error: x", code="internal_error", failure_phase="guest",
        bridge_dispatch_started=True, output=[], replay_safe=False, telemetry=TELEMETRY,
    )
    assert list(result) == [
        "status", "error", "code", "failurePhase", "bridgeDispatchStarted", "output",
        "replaySafe", "telemetry",
    ]
    with pytest.raises(ValueError):
        failed_result(
            error="x", code="oops", failure_phase="guest", bridge_dispatch_started=False,
            output=[], replay_safe=False, telemetry={},
        )


def test_input_failed() -> None:
    assert input_failed_result("m", replay_safe=True, telemetry={}) == {
        "status": "failed",
        "error": "m",
        "code": "invalid_input",
        "failurePhase": "input",
        "bridgeDispatchStarted": False,
        "output": [],
        "replaySafe": True,
        "telemetry": make_telemetry(),
    }


@pytest.mark.asyncio
async def test_result_json_writes_output_in_slices_and_equals_compact_json() -> None:
    import asyncio

    from cellblock.server.runs import compact_json, result_json
    from cellblock.server.runs._result import RESULT_JSON_SLICE_CHARS

    entries = [{"type": "text", "text": "z" * 40_000}] * 60 + [{"type": "json", "value": {"a": [1.5, None, "é\ud800"]}}]
    result = completed_result(value={"v": 1.0}, output=entries, replay_safe=True, telemetry=TELEMETRY)
    turns = 0

    async def count_turns() -> None:
        nonlocal turns
        while True:
            await asyncio.sleep(0)
            turns += 1

    counter = asyncio.ensure_future(count_turns())
    await asyncio.sleep(0)
    text = await result_json(result)
    counter.cancel()
    assert text == compact_json(result)
    assert turns >= 60 * 40_000 // RESULT_JSON_SLICE_CHARS - 1  # other callbacks ran between the slices
    assert await result_json(failed_result(error="e", code="timeout", failure_phase="guest", bridge_dispatch_started=False, output=[], replay_safe=False, telemetry=TELEMETRY)) == compact_json(
        failed_result(error="e", code="timeout", failure_phase="guest", bridge_dispatch_started=False, output=[], replay_safe=False, telemetry=TELEMETRY)
    )


@pytest.mark.asyncio
@pytest.mark.parametrize("value", [{"v": [1.5, None, "é"]}, ["x" * 70_000, 1e21], "s"])
async def test_a_value_read_once_is_spliced_into_the_result_as_its_text(value: object) -> None:
    # The leg's end keeps a final value as its compact text (runs._final_value): the result is the
    # one the parsed value gives, and the text is never serialised again.
    from cellblock.server.runs import compact_json, result_json
    from cellblock.server.runs._output import JsonText

    read = JsonText(compact_json(value), isinstance(value, dict))
    expected = compact_json(completed_result(value=value, output=[], replay_safe=False, telemetry=TELEMETRY))
    assert await result_json(completed_result(value=read, output=[], replay_safe=False, telemetry=TELEMETRY)) == expected
