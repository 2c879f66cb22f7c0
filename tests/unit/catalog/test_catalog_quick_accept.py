"""The quick input acceptance (``catalog._fast_accept``) never accepts what the full contract check refuses.

Random inputs, including the near misses (``1.0`` and ``True`` for an integer, a missing or an extra
property, ``null``), are checked against random simple schemas: whatever the quick test accepts, the
jsonschema validator accepts too. Schemas outside the simple form get no quick test at all.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from cellblock.server.catalog._contracts import check_input_contract, compile_schema
from cellblock.server.catalog._entries import CatalogEntry
from cellblock.server.catalog._errors import BridgeReplyError
from cellblock.server.catalog._fast_accept import quick_acceptor

_TYPES = ["string", "integer", "number", "boolean", "null", "object", "array"]
_NAMES = st.sampled_from(["n", "a", "b", "path", "x"])
_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False, allow_infinity=False) | st.sampled_from([1.0, 0.0, -2.0]) | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=6,
)


@st.composite
def _schemas(draw: Any) -> dict[str, Any]:
    properties = draw(st.dictionaries(_NAMES, st.sampled_from(_TYPES).map(lambda t: {"type": t}), max_size=4))
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if draw(st.booleans()):
        schema["required"] = draw(st.lists(_NAMES, max_size=3, unique=True))
    if draw(st.booleans()):
        schema["additionalProperties"] = draw(st.booleans())
    if draw(st.booleans()):
        schema["description"] = "a tool"
    return schema


@settings(max_examples=400, deadline=None)
@given(_schemas(), st.dictionaries(_NAMES, _VALUES, max_size=5) | _VALUES)
def test_what_the_quick_test_accepts_the_full_check_accepts(schema: dict[str, Any], instance: Any) -> None:
    validator = compile_schema(schema, "parameters")
    accept = quick_acceptor(validator)
    assert accept is not None, schema
    if accept(instance):
        assert validator.is_valid(instance), (schema, instance)


def test_the_common_flat_schema_is_decided_quickly_both_ways() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"], "additionalProperties": False}
    accept = quick_acceptor(compile_schema(schema, "parameters"))
    assert accept is not None
    assert accept({"n": 3})
    for refused in ({"n": True}, {"n": 1.0}, {}, {"n": 1, "m": 2}, [1], None, {"n": None}):
        assert not accept(refused), refused


def test_schemas_beyond_the_simple_form_get_no_quick_test() -> None:
    for schema in (
        {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0}}},
        {"type": "object", "properties": {"n": {"type": ["integer", "null"]}}},
        {"type": "object", "properties": {"n": {"type": "integer", "nullable": True}}},
        {"type": "object", "patternProperties": {"^x": {"type": "string"}}},
        {"type": "object", "additionalProperties": {"type": "string"}},
        {"$schema": "http://json-schema.org/draft-04/schema", "type": "object"},
        {"properties": {"n": {"type": "integer"}}},
        True,
    ):
        assert quick_acceptor(compile_schema(schema, "parameters")) is None, schema


def test_a_refused_input_still_gets_the_full_checks_problem() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"], "additionalProperties": False}
    entry = CatalogEntry(id="host:core:echo", source="host", owner="core", name="echo", label=None, description="", parameters=schema, input_validator=compile_schema(schema, "parameters"))
    check_input_contract(entry, {"n": 2})
    for instance, problem in (({"n": "2"}, "/n: must be integer"), ({}, "missing required argument(s): n"), ({"n": 1, "m": 1}, "unexpected argument(s): m")):
        try:
            check_input_contract(entry, instance)
        except BridgeReplyError as exc:
            assert problem in exc.message, exc.message
            assert exc.code == "input_contract"
        else:
            raise AssertionError(f"{instance} was accepted")
