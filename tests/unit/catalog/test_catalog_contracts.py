"""Input and output contracts of host entries (SPEC §8.4, [B08], [B10])."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest
import rpds

from cellblock.server.catalog import BridgeReplyError, Catalog, CatalogEntry, check_input_contract, check_output_contract, is_fault
from cellblock.server.catalog._errors import CatalogRegistrationError

PARAMETERS = {
    "type": "object",
    "properties": {
        "path": {"type": "string"},
        "count": {"type": "integer", "minimum": 1},
        "mode": {"enum": ["r", "w"]},
        "opts": {
            "type": "object",
            "properties": {"depth": {"type": "integer"}, "note": {"type": "string", "nullable": True}},
            "required": ["depth"],
        },
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 3}},
    },
    "required": ["path", "count"],
    "additionalProperties": False,
}

OUTPUT = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}


def entry(parameters: Any = PARAMETERS, output: Any = OUTPUT, source: str = "host") -> CatalogEntry:
    tool: dict[str, Any] = {"source": source, "owner": "o", "name": "t", "parameters": parameters, "outputSchema": output}
    (registered,) = Catalog().register([tool]).entries
    return registered


HOST = entry()


def input_problem(arguments: Any, target: CatalogEntry = HOST) -> str:
    with pytest.raises(BridgeReplyError) as caught:
        check_input_contract(target, arguments)
    error = caught.value
    assert (error.provenance, error.code) == ("input", "input_contract")
    prefix = f'Tool "{target.id}" input does not match its parameters: '
    assert error.message.startswith(prefix) and error.message.endswith(".")
    return error.message[len(prefix) : -1]


@pytest.mark.parametrize(
    ("arguments", "problems"),
    [
        ({}, "missing required argument(s): path, count"),
        ({"count": 1}, "missing required argument(s): path"),
        ({"path": "a", "count": 1, "zz": 1, "aa": 2}, "unexpected argument(s): zz, aa"),
        ({"count": 1, "extra": True}, "missing required argument(s): path; unexpected argument(s): extra"),
        ({"path": "a", "count": "3"}, "/count: must be integer"),
        ({"path": "a", "count": 0}, "/count: must be >= 1"),
        ({"path": "a", "count": 1, "mode": "x"}, '/mode: must be one of ["r","w"]'),
        ({"path": "a", "count": 1, "opts": {}}, '/opts: missing required property "depth"'),
        ({"path": "a", "count": 1, "opts": {"depth": 1.5}}, "/opts/depth: must be integer"),
        ({"path": "a", "count": 1, "opts": {"depth": 1, "note": 5}}, "/opts/note: must be string or null"),
        ({"path": "a", "count": 1, "tags": ["ok", "long"]}, "/tags/1: must have at most 3 characters"),
        ([1], "/: must be object"),
    ],
)
def test_input_contract_problems(arguments: Any, problems: str) -> None:
    assert input_problem(arguments) == problems


@pytest.mark.parametrize(
    "arguments",
    [
        {"path": "a", "count": 1},
        {"path": "a", "count": 2, "mode": "w", "opts": {"depth": 0, "note": None}, "tags": ["a"]},
    ],
)
def test_input_contract_accepts(arguments: Any) -> None:
    check_input_contract(HOST, arguments)


def test_nullable_allows_null_at_top_level_of_a_property_and_in_enums() -> None:
    target = entry({"type": "object", "properties": {"m": {"type": "string", "enum": ["a"], "nullable": True}}})
    check_input_contract(target, {"m": None})
    assert input_problem({"m": "b"}, target) == '/m: must be one of ["a"]'


def test_entries_without_contracts_pass_anything() -> None:
    check_input_contract(entry(parameters=None), {"anything": 1})
    check_input_contract(entry(source="client", parameters={"type": "object", "required": ["x"]}), {})
    check_output_contract(entry(output=None), {"details": 5})
    check_output_contract(entry(source="mcp", output=OUTPUT), {"content": []})


@pytest.mark.parametrize(
    "result",
    [{"content": []}, {"details": {"text": 5}}, {"details": None}, "text", None],
)
def test_output_contract_rejects(result: Any) -> None:
    with pytest.raises(BridgeReplyError) as caught:
        check_output_contract(HOST, result)
    assert caught.value.message == 'Tool "host:o:t" returned details that do not match its declared outputSchema.'
    assert caught.value.provenance == "internal"
    assert caught.value.code is None


def test_output_contract_accepts_matching_details() -> None:
    check_output_contract(HOST, {"content": [], "details": {"text": "ok", "more": 1}})


def test_output_nullable_details() -> None:
    check_output_contract(entry(output={"type": "object", "nullable": True}), {"details": None})


def test_unresolvable_reference_is_refused_at_registration() -> None:
    # A trusted schema that could never be evaluated is refused when registered (issue #5),
    # rather than failing every later call; remote references are never fetched.
    with pytest.raises(CatalogRegistrationError, match=r'tool 0 \(host:o:t\): parameters is not a valid JSON Schema: \$ref "https://example.invalid/s.json" does not resolve'):
        entry({"type": "object", "properties": {"a": {"$ref": "https://example.invalid/s.json"}}})


@pytest.mark.parametrize(
    ("schema", "refused"),
    [
        ({"$ref": "#/defs/nope"}, True),
        ({"$ref": "http://example.com/remote.json"}, True),
        ({"$ref": "#/$defs/a", "$defs": {"a": {"type": "string"}}}, False),
        ({"type": "object", "properties": {"child": {"$ref": "#"}}}, False),
    ],
)
def test_unresolvable_refs_are_refused_at_registration(schema: dict, refused: bool) -> None:
    from cellblock.server.catalog._contracts import compile_schema

    if refused:
        with pytest.raises(ValueError, match="does not resolve inside the schema"):
            compile_schema(schema, "outputSchema")
    else:
        compile_schema(schema, "outputSchema")


def test_an_input_that_takes_too_much_cpu_to_check_is_b10_naming_the_budget() -> None:
    wide = entry(parameters={"type": "object", "properties": {"xs": {"type": "array", "items": {"type": "string", "minLength": 1}}}}, output=None)
    with pytest.raises(BridgeReplyError) as err:
        check_input_contract(wide, {"xs": ["a"] * 2_000_000})
    assert "took longer than 20 ms; send a smaller input" in str(err.value)


def test_time_spent_waiting_for_a_core_does_not_count_against_the_contract_budget() -> None:
    # A loaded machine: the loop's thread waits 50 ms for a core in the middle of a small check.
    # The budget is CPU time of the checking thread; a small input must still pass.
    import time

    from cellblock.server.catalog import _bounded

    real = _bounded.budgeted
    stalled: list[bool] = []

    def keyword(validator: Any, value: Any, instance: Any, schema: Any) -> None:
        if not stalled:
            stalled.append(True)
            time.sleep(0.05)  # wall time passes, the thread uses no CPU
        return None

    check = real(keyword)
    with _bounded.budget():
        assert list(check(None, None, None, None)) == []
        assert list(check(None, None, None, None)) == []
    assert stalled == [True]


def test_unique_items_over_many_objects_is_linear_and_keeps_jsonschemas_equality() -> None:
    # jsonschema compared unsortable items pairwise inside one keyword evaluation, past every
    # budget check: 4,000 objects held the loop for 11 s.
    import time

    uniq = entry(parameters={"type": "object", "properties": {"xs": {"type": "array", "uniqueItems": True}}}, output=None)
    items = {"xs": [{"a": i, "b": [i, {"c": True}]} for i in range(20_000)]}
    started = time.thread_time()
    check_input_contract(uniq, items)
    assert time.thread_time() - started < 2  # pairwise: about 4 minutes
    for same in ([{"a": 1, "b": [True]}, {"b": [True], "a": 1}], [1, 1.0], [[{"x": None}], [{"x": None}]], ["a", "a"], [True, True]):
        with pytest.raises(BridgeReplyError, match="duplicate items"):
            check_input_contract(uniq, {"xs": same})
    for distinct in ([1, True], [0, False], [[1, 0], [1, False]], [{"a": 1}, {"a": 1, "b": None}], ["1", 1], [None, 0], [[], {}], [{"a": [1]}, {"a": [True]}]):
        check_input_contract(uniq, {"xs": distinct})


def test_matching_many_properties_against_patterns_stops_at_the_budget() -> None:
    # patternProperties matches every property inside one keyword evaluation: 50,000 properties
    # against 20 patterns held the loop 1.2 s of CPU before the next keyword's budget check.
    import time

    patterns = {f"^p{i}_": {"type": "string"} for i in range(20)}
    wide = entry(parameters={"type": "object", "patternProperties": patterns, "additionalProperties": {"type": "string"}}, output=None)
    properties = {f"k{i}": "v" for i in range(50_000)}
    started = time.thread_time()
    with pytest.raises(BridgeReplyError, match="took longer than 20 ms"):
        check_input_contract(wide, properties)
    assert time.thread_time() - started < 0.4  # before: 1.2 s
    check_input_contract(wide, {"p1_x": "v", "other": "w"})


@pytest.mark.parametrize(
    ("pattern", "reason"),
    [
        ("^(?=a)a+$", "invalid perl operator: (?= (lookahead and lookbehind need backtracking)"),
        ("(?<!a)b", "invalid perl operator: (?<! (lookahead and lookbehind need backtracking)"),
        ("(a)\\1", "invalid escape sequence: \\1 (backreferences need backtracking)"),
        ("(ab", "missing ): (ab (not a pattern RE2 accepts)"),
        ("a{1001}", "invalid repetition size: {1001} (not a pattern RE2 accepts)"),
        ("\\Z", "invalid escape sequence: \\Z (not a pattern RE2 accepts)"),
    ],
)
def test_a_refused_pattern_says_which_pattern_and_why(pattern: str, reason: str) -> None:
    # Every refusal said "lookaround or backreference", also for a pattern that is merely malformed.
    for schema in ({"type": "string", "pattern": pattern}, {"type": "object", "patternProperties": {pattern: {}}}):
        with pytest.raises(CatalogRegistrationError) as raised:
            Catalog().register([{"source": "host", "name": "t", "parameters": schema}])
        assert raised.value.problem == f"parameters is not a valid JSON Schema: pattern {pattern!r} is outside the linear-time engine (RE2): {reason}; contracts match patterns in linear time only"


def test_b10_names_at_most_20_arguments_each_cut_to_200_and_cuts_the_pointer() -> None:
    extras = {f"{'k' * 300}{i:03d}": i for i in range(500)}
    problems = input_problem({"path": "a", "count": 1, **extras})
    assert problems == "unexpected argument(s): " + ", ".join(["k" * 200] * 20) + ", ..."
    nested = entry({"type": "object", "properties": {"a": {"type": "object", "additionalProperties": {"type": "object", "additionalProperties": {"type": "string"}}}}})
    deep_key = "d" * 5000
    problems = input_problem({"a": {deep_key: {deep_key: 1}}}, nested)
    assert problems == f"/a/{deep_key[:197]}: must be string"


# A recursive ``$ref`` schema and the bridge's nesting bound: the check has room for it, and a check that
# still runs out of room, or a Rust extension that panics under it, is a specific refusal, never a crash.
_NODE = {"type": "object", "properties": {"next": {"$ref": "#/$defs/n"}}}
TREE = entry({"type": "object", "$defs": {"n": _NODE}, "properties": {"x": {"$ref": "#/$defs/n"}}}, {"$defs": {"n": _NODE}, "$ref": "#/$defs/n"})


def _tree(depth: int, leaf: Any = None) -> Any:
    node: Any = {} if leaf is None else {"next": leaf}
    for _ in range(depth):
        node = {"next": node}
    return node


@pytest.mark.parametrize("depth", [180, 257])
def test_a_recursive_schema_checks_a_tree_at_the_nesting_bound(depth: int) -> None:
    # At the interpreter's default recursion limit a 180-level tree could not be evaluated.
    check_input_contract(TREE, {"x": _tree(depth)})
    check_output_contract(TREE, {"details": _tree(depth)})
    with pytest.raises(BridgeReplyError) as caught:
        check_input_contract(TREE, {"x": _tree(depth, leaf=5)})
    assert caught.value.message.startswith('Tool "host:o:t" input does not match its parameters: /x/next/next/'), caught.value.message


def _panic() -> BaseException:
    """A real pyo3 ``PanicException`` (a ``BaseException``): ``rpds`` panics when a key's ``__eq__`` raises."""

    class Key:
        def __hash__(self) -> int:
            return 1

        def __eq__(self, other: object) -> bool:
            raise RecursionError("maximum recursion depth exceeded")

    try:
        rpds.HashTrieMap({Key(): 1}).get(Key())
    except BaseException as exc:  # noqa: BLE001 - the panic is what we want
        return exc
    raise AssertionError("rpds did not panic")


def test_a_panicking_check_is_a_specific_refusal() -> None:
    panic = _panic()
    assert not isinstance(panic, Exception) and is_fault(panic)
    assert not is_fault(asyncio.CancelledError()) and not is_fault(KeyboardInterrupt())

    class Panicking:
        schema = TREE.parameters  # no quick acceptance for a $ref schema: the full check runs

        def iter_errors(self, instance: Any) -> Any:
            raise panic

        def is_valid(self, instance: Any) -> bool:
            raise panic

    tree = dataclasses.replace(TREE, input_validator=Panicking(), output_validator=Panicking())
    with pytest.raises(BridgeReplyError) as caught:
        check_input_contract(tree, {"x": {}})
    assert caught.value.message == 'Tool "host:o:t" input does not match its parameters: /: the parameters schema could not be evaluated for this input.'
    with pytest.raises(BridgeReplyError) as caught:
        check_output_contract(tree, {"details": {}})
    assert caught.value.message == 'Tool "host:o:t" returned details that do not match its declared outputSchema.'
