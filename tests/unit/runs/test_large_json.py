"""Long nested-call arguments and tool results read in a worker give the loop's own answers (SPEC §3.1 item 6, §8.4).

The worker functions run here in-process (the integration tests run them in real worker
processes): each is compared with what the loop does for the same text.
"""

from __future__ import annotations

import json
import pickle
from typing import Any

import pytest

from cellblock.server.api._catalogs import ScopeCatalog
from cellblock.server.catalog import BridgeReplyError, compact_json
from cellblock.server.config import CodeModeConfig
from cellblock.server.runs import BridgeMethod, JsonText, PreparedResult, ToolOutcome, portable, result_in_worker
from cellblock.server.runs._codec import decode_run, encode_run
from cellblock.server.runs._large_json import args_checked_in_worker, args_in_worker, input_check_in_worker
from cellblock.server.runs._state import PendingRequest
from tests.unit.runs.test_codec import _catalog, _record, _run

SCHEMA = {"type": "object", "properties": {"k": {"type": "string"}, "xs": {"type": "array"}}, "required": ["k"], "additionalProperties": False}
TOOLS = [
    {"source": "host", "name": "strict", "parameters": SCHEMA, "outputSchema": {"type": "object", "required": ["n"]}},
    {"source": "host", "name": "free"},
    {"source": "mcp", "owner": "gh", "name": "issue"},
]
ROWS = [{"i": i, "f": i + 0.5, "e": 1e-7 * i, "s": "é\ud800"} for i in range(300)]


def _view() -> Any:
    catalog = ScopeCatalog(CodeModeConfig())
    catalog.catalog.register(TOOLS)
    return catalog.view()


def test_arguments_read_in_a_worker_are_the_loops_values_as_compact_text() -> None:
    args, deep = args_in_worker(json.dumps(["host:core:free", {"xs": ROWS}, [1.0, 2], 7], ensure_ascii=False), 1)
    assert not deep and args is not None
    assert args[0] == "host:core:free" and args[3] == 7
    assert args[1] == JsonText(compact_json({"xs": ROWS}), True) and args[2] == JsonText("[1,2]", False)
    # The namespace's root and path stay values; a long string input becomes text too.
    long = "q" * 70_000
    assert args_in_worker(json.dumps(["MCP", "a.b", long]), 2) == (["MCP", "a.b", JsonText(json.dumps(long), False)], False)


@pytest.mark.parametrize("text", ["[1,", '{"a":1}', "[NaN]", '["x", {"a": Infinity}]', "7"])
def test_text_that_is_no_json_array_is_p05_like_on_the_loop(text: str) -> None:
    assert args_in_worker(text, 1) == (None, False)


@pytest.mark.parametrize("depth", [3_000, 100_000])
def test_arguments_nested_past_the_parser_are_b23_like_on_the_loop(depth: int) -> None:
    assert args_in_worker('["host:core:free",' + "[" * depth + "]" * depth + "]", 1) == ([], True)


def test_the_input_contract_checked_in_a_worker_gives_the_loops_b10() -> None:
    view = _view()
    entry = view.entry("host:core:strict")
    for bad in ({"xs": []}, {"k": "v", "extra": 1}, {"k": 5}):
        with pytest.raises(BridgeReplyError) as raised:
            view.resolve_call("callValue", ["host:core:strict", bad])
        assert input_check_in_worker(portable(entry), compact_json(bad)) == (raised.value.message, "input", "input_contract")
    assert input_check_in_worker(portable(entry), compact_json({"k": "v", "xs": ROWS})) is None
    # Checked in the call that reads the arguments (the input is read once): the same answers, for the named entry.
    for value in ({"xs": []}, {"k": "v", "extra": 1}, {"k": 5}, {"k": "v", "xs": ROWS}):
        text = json.dumps(["host:core:strict", value], ensure_ascii=False)
        assert args_checked_in_worker(text, 1, portable(entry)) == (args_in_worker(text, 1), ("host:core:strict", input_check_in_worker(portable(entry), compact_json(value))))
    # Nothing to check when there is no input, or the text is refused before it.
    assert args_checked_in_worker('["host:core:strict"]', 1, portable(entry)) == ((["host:core:strict"], False), None)
    assert args_checked_in_worker("[1,", 1, portable(entry)) == ((None, False), None)
    assert args_checked_in_worker('["x",' + "[" * 3000 + "]" * 3000 + "]", 1, portable(entry)) == (([], True), None)
    # Resolving a long input defers the check to the worker, and such a call is not dispatched until then.
    call = view.resolve_call("callValue", ["host:core:strict", JsonText('{"xs":[]}', True)])
    assert call.input_unchecked
    assert not view.resolve_call("callValue", ["host:core:free", JsonText("{}", True)]).input_unchecked
    with pytest.raises(BridgeReplyError, match="takes a single object argument"):
        view.resolve_call("namespace", ["MCP", next(iter(view.namespace.paths)), JsonText("[1]", False)])
    assert view.resolve_call("namespace", ["MCP", next(iter(view.namespace.paths)), JsonText("{}", True)]).input == JsonText("{}", True)


@pytest.mark.parametrize("method", [BridgeMethod.CALL, BridgeMethod.CALL_VALUE])
@pytest.mark.parametrize(
    "result",
    [{"details": {"n": 1, "rows": ROWS}}, {"details": {"rows": []}}, {"content": [1.5, 2.0]}, [1, {"details": 2}], "text", None],
)
def test_a_result_read_in_a_worker_is_projected_like_on_the_loop(method: BridgeMethod, result: Any) -> None:
    view = _view()
    # Spaced JSON is written again; compact JSON (what clients send) is the worker's answer itself, never sent back.
    for name, separators in (("strict", None), ("free", None), ("strict", (",", ":")), ("free", (",", ":"))):
        call = view.resolve_call(method.value, [f"host:core:{name}", {"k": "v"}])
        ok_json = json.dumps(result, ensure_ascii=False, separators=separators)
        assert result_in_worker(ok_json, None).same == (ok_json == compact_json(result))
        loop: Any
        try:
            loop = compact_json(view.project_result(method.value, call, ToolOutcome("n1", ok_json=ok_json), 1 << 30))
        except BridgeReplyError as exc:
            loop = exc.message
        prepared = result_in_worker(ok_json, portable(call.entry) if call.entry.output_validator is not None else None)
        worker: Any
        try:
            projected = view.project_result(method.value, call, ToolOutcome("n1", ok_json=ok_json, prepared=prepared), 1 << 30)
            assert isinstance(projected, JsonText)
            worker = projected.text
        except BridgeReplyError as exc:
            worker = exc.message
        assert worker == loop, (name, method, result)
        # Without the entry (a result on another leg's stream) the contract is checked on the loop: same answer.
        unknown = result_in_worker(ok_json, None)
        try:
            again = view.project_result(method.value, call, ToolOutcome("n1", ok_json=ok_json, prepared=unknown), 1 << 30)
            assert isinstance(again, JsonText) and again.text == loop
        except BridgeReplyError as exc:
            assert exc.message == loop


@pytest.mark.parametrize("ok_json", ["[NaN]", '{"details": Infinity}', "{", "[" * 5000 + "]" * 5000])
def test_a_result_that_is_no_json_is_refused_like_on_the_loop(ok_json: str) -> None:
    view = _view()
    call = view.resolve_call("callValue", ["host:core:free", {}])
    with pytest.raises(BridgeReplyError) as loop:
        view.project_result("callValue", call, ToolOutcome("n1", ok_json=ok_json), 1 << 30)
    with pytest.raises(BridgeReplyError) as worker:
        view.project_result("callValue", call, ToolOutcome("n1", ok_json=ok_json, prepared=result_in_worker(ok_json, None)), 1 << 30)
    assert worker.value.message == loop.value.message
    prepared = result_in_worker(ok_json, None)
    with pytest.raises(BridgeReplyError, match="more than this cell accepts"):
        view.project_result("callValue", call, ToolOutcome("n1", ok_json=ok_json, prepared=prepared), prepared.size - 1)


def test_a_parked_run_with_long_arguments_stores_their_values() -> None:
    run = _run(_catalog().view())
    text = compact_json({"k": "v", "xs": ROWS})
    call = run.view.resolve_call("callValue", ["client:app:slow", JsonText(text, True)])
    run.pending["bridge:callValue:9"] = PendingRequest("bridge:callValue:9", BridgeMethod.CALL_VALUE, ["client:app:slow", JsonText(text, True)], call=call)
    back = decode_run(_record(run), lambda state, _scope: type(run.view).from_state(state, CodeModeConfig()))
    p = back.pending["bridge:callValue:9"]
    assert p.args == ["client:app:slow", json.loads(text)] and p.call is not None and p.call.input == json.loads(text)
    assert json.loads(encode_run(run))["pending"][-1]["args"][1] == json.loads(text)


def test_a_result_no_worker_read_within_its_budget_is_b26() -> None:
    view = _view()
    call = view.resolve_call("callValue", ["host:core:free", {}])
    outcome = ToolOutcome("n1", ok_json='{"a":123}', prepared=PreparedResult(9, False, overran=True))
    with pytest.raises(BridgeReplyError, match=r'^Tool "host:core:free" returned 9 characters of JSON, more than the host could read within its 30000 ms budget; ask for less data\.$'):
        view.project_result("callValue", call, outcome, 1 << 30)


@pytest.mark.parametrize("depth", [500, 990])
def test_an_id_nested_past_what_pickles_is_b23_not_a_dead_worker(depth: int) -> None:
    """An id nested deeper than pickle goes is the request's B23, not a dead worker.

    The head (id, path) comes back to the loop as values; before, its pickling raised
    RecursionError and pebble killed the shared worker (a reviewer's finding).
    """
    nested = "[" * depth + '"x"' + "]" * depth
    args, deep = args_in_worker(f'[{nested}, {{"p": "{"p" * 70_000}"}}]', 1)
    assert (args, deep) == ([], True)
    assert pickle.loads(pickle.dumps((args, deep))) == ([], True)


def test_a_parked_run_with_many_long_arguments_splices_each_once() -> None:
    """Every JsonText of a parked run lands at its own place (spliced in one pass; a replace per text was quadratic)."""
    run = _run(_catalog().view())
    texts = [compact_json({"k": f"v{i}", "xs": ROWS[: i + 1]}) for i in range(40)]
    for i, text in enumerate(texts):
        args = ["client:app:slow", JsonText(text, True)]
        call = run.view.resolve_call("callValue", args)
        run.pending[f"bridge:callValue:{i + 1}"] = PendingRequest(f"bridge:callValue:{i + 1}", BridgeMethod.CALL_VALUE, args, call=call)
    pending = json.loads(encode_run(run))["pending"]
    got = [p["args"][1] for p in pending if p["args"][0] == "client:app:slow"]
    assert got == [json.loads(t) for t in texts]
