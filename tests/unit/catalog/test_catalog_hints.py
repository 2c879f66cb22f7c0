"""Schema hints (SPEC §7.4): expected texts derived by hand from the rules."""

from __future__ import annotations

from typing import Any

import pytest

from cellblock.server.catalog._hints import INPUT_LIMITS, OUTPUT_LIMITS, Hint, input_hint, output_hint, render_hint

S = {"type": "string"}
N = {"type": "number"}
B = {"type": "boolean"}


def obj(properties: dict[str, Any] | None = None, required: list[Any] | None = None, **extra: Any) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object"}
    if properties is not None:
        schema["properties"] = properties
    if required is not None:
        schema["required"] = required
    schema.update(extra)
    return schema


def closed(properties: dict[str, Any], required: list[Any] | None = None, **extra: Any) -> dict[str, Any]:
    return obj(properties, required, additionalProperties=False, **extra)


def nest_arrays(levels: int, leaf: dict[str, Any]) -> dict[str, Any]:
    schema = leaf
    for _ in range(levels):
        schema = {"type": "array", "items": schema}
    return schema


LONG32 = [f"n{i}" + "x" * 30 for i in range(10)]  # 32-character names: each part is 40 characters

# (case id, schema, limits, expected text, expected complete)
RENDER_CASES: list[tuple[str, Any, Any, str, bool]] = [
    ("not-an-object", "string", INPUT_LIMITS, "unknown", False),
    ("boolean-schema", True, INPUT_LIMITS, "unknown", False),
    ("empty-object-is-top", {}, INPUT_LIMITS, "unknown", True),
    ("string", S, INPUT_LIMITS, "string", True),
    ("integer-is-number", {"type": "integer"}, INPUT_LIMITS, "number", True),
    ("null", {"type": "null"}, INPUT_LIMITS, "null", True),
    ("unknown-type-name", {"type": "date"}, INPUT_LIMITS, "unknown", False),
    ("no-type", {"description": "x"}, INPUT_LIMITS, "unknown", False),
    ("array-without-items", {"type": "array"}, INPUT_LIMITS, "Array<unknown>", False),
    ("array-of-boolean", {"type": "array", "items": B}, INPUT_LIMITS, "Array<boolean>", True),
    (
        "closed-object-required-first",
        closed({"b": S, "a": N}, ["b"]),
        INPUT_LIMITS,
        "{ b: string; a?: number }",
        True,
    ),
    ("object-additional-absent", obj({"b": S, "a": N}, ["b"]), INPUT_LIMITS, "{ b: string; a?: number }", False),
    (
        "object-additional-true",
        obj({"b": S, "a": N}, ["b"], additionalProperties=True),
        INPUT_LIMITS,
        "{ b: string; a?: number; ... }",
        False,
    ),
    ("object-without-properties", obj(), INPUT_LIMITS, "{ ... }", False),
    ("closed-object-without-properties", obj(additionalProperties=False), INPUT_LIMITS, "{}", True),
    (
        "closed-no-properties-but-required",
        obj(required=["x"], additionalProperties=False),
        INPUT_LIMITS,
        "{ ... }",
        False,
    ),
    ("closed-empty-properties", closed({}), INPUT_LIMITS, "{}", True),
    ("empty-properties-additional-schema", obj({}, additionalProperties={}), INPUT_LIMITS, "{ ... }", False),
    ("enum-literal-union", {"enum": ["a", "b", 1, None]}, INPUT_LIMITS, '"a" | "b" | 1 | null', True),
    ("enum-of-nine-is-ignored", {"enum": list(range(9))}, INPUT_LIMITS, "unknown", False),
    ("enum-distinct-texts", {"enum": ["a", "a"], "type": "string"}, INPUT_LIMITS, '"a"', True),
    (
        "enum-over-96-chars-falls-to-type",
        {"type": "string", "enum": ["a" * 40, "b" * 40, "c" * 40]},
        INPUT_LIMITS,
        "string",
        True,
    ),
    ("enum-numbers-js-style", {"enum": [1.0, 1.5, 2e21, 1e-7]}, INPUT_LIMITS, "1 | 1.5 | 2e+21 | 1e-7", True),
    ("const-string", {"const": "x"}, INPUT_LIMITS, '"x"', True),
    ("const-boolean-wins-over-type", {"type": "boolean", "const": True}, INPUT_LIMITS, "true", True),
    ("const-object-is-ignored", {"const": {"a": 1}, "type": "object", "additionalProperties": False}, INPUT_LIMITS, "{}", True),
    ("type-array", {"type": ["string", "null"]}, INPUT_LIMITS, "string | null", True),
    ("type-array-of-five", {"type": ["string", "number", "boolean", "null", "integer"]}, INPUT_LIMITS, "unknown", False),
    ("type-array-distinct", {"type": ["integer", "number"]}, INPUT_LIMITS, "number", True),
    ("type-array-member-incomplete", {"type": ["string", "array"]}, INPUT_LIMITS, "unknown", False),
    ("nullable-true", {"type": "string", "nullable": True}, INPUT_LIMITS, "string | null", True),
    ("nullable-true-already-null", {"type": ["string", "null"], "nullable": True}, INPUT_LIMITS, "string | null", True),
    ("nullable-false-ignored", {"type": "string", "nullable": False}, INPUT_LIMITS, "string", True),
    ("nullable-not-boolean", {"type": "string", "nullable": "yes"}, INPUT_LIMITS, "unknown", False),
    ("nullable-without-type", {"nullable": True, "enum": ["a"]}, INPUT_LIMITS, "unknown", False),
    ("anyof-consts", {"anyOf": [{"const": "a"}, {"const": "b"}]}, INPUT_LIMITS, '"a" | "b"', True),
    (
        "oneof-six-consts-literal-beats-variant-cap",
        {"oneOf": [{"const": c} for c in "abcdef"]},
        INPUT_LIMITS,
        '"a" | "b" | "c" | "d" | "e" | "f"',
        True,
    ),
    ("oneof-nine-consts", {"oneOf": [{"const": i} for i in range(9)]}, INPUT_LIMITS, "unknown", False),
    ("oneof-structural", {"oneOf": [S, N]}, INPUT_LIMITS, "string | number", True),
    ("anyof-mixed", {"anyOf": [{"const": "a"}, N]}, INPUT_LIMITS, '"a" | number', True),
    ("anyof-and-oneof", {"anyOf": [S], "oneOf": [N]}, INPUT_LIMITS, "unknown", False),
    ("anyof-not-array", {"anyOf": "x"}, INPUT_LIMITS, "unknown", False),
    ("oneof-empty", {"oneOf": []}, INPUT_LIMITS, "unknown", False),
    ("anyof-with-type", {"anyOf": [S], "type": "string"}, INPUT_LIMITS, "unknown", False),
    ("anyof-five-structural", {"anyOf": [S, N, B, {"type": "null"}, {"type": "array", "items": S}]}, INPUT_LIMITS, "unknown", False),
    (
        "anyof-const-with-ref-is-structural-and-incomplete",
        {"anyOf": [{"const": "a"}, {"const": "b", "$ref": "#/x"}]},
        INPUT_LIMITS,
        "unknown",
        False,
    ),
    ("anyof-incomplete-variant", {"anyOf": [S, {"type": "array"}]}, INPUT_LIMITS, "unknown", False),
    ("ref-keeps-text", {"type": "string", "$ref": "#/$defs/x"}, INPUT_LIMITS, "string", False),
    ("allof-keeps-text", {"type": "number", "allOf": [{"minimum": 1}]}, INPUT_LIMITS, "number", False),
    (
        "pattern-properties-on-object",
        closed({"a": S}, ["a"], patternProperties={"^x": {}}),
        INPUT_LIMITS,
        "{ a: string }",
        False,
    ),
    ("input-depth-limit", nest_arrays(4, S), INPUT_LIMITS, "Array<Array<Array<Array<unknown>>>>", False),
    ("output-depth-allows-more", nest_arrays(4, S), OUTPUT_LIMITS, "Array<Array<Array<Array<string>>>>", True),
    ("non-identifier-key", closed({"a-b": S, "$ok_1": B}, ["a-b"]), INPUT_LIMITS, '{ "a-b": string; $ok_1?: boolean }', True),
    ("required-missing-from-properties", closed({"a": S}, ["a", "zz"]), INPUT_LIMITS, "{ a: string; ... }", False),
    ("required-non-string", closed({"a": S}, ["a", 7]), INPUT_LIMITS, "{ a: string; ... }", False),
    (
        "seventeen-optional-input-properties",
        closed({f"p{i:02d}": B for i in range(17)}),
        INPUT_LIMITS,
        "{ " + "; ".join(f"p{i:02d}?: boolean" for i in range(16)) + "; ... }",
        False,
    ),
    (
        "property-name-over-128",
        closed({"a": S, "L" * 129: S}),
        INPUT_LIMITS,
        "{ a?: string; ... }",
        False,
    ),
    (
        "parts-stop-at-300-chars",
        closed({name: S for name in LONG32}, LONG32),
        INPUT_LIMITS,
        "{ " + "; ".join(f"{name}: string" for name in LONG32[:7]) + "; ... }",
        False,
    ),
    (
        "spec-example-output",
        {
            "type": "array",
            "items": closed({"id": S, "paid": B, "tons": N}, ["id", "paid", "tons"]),
        },
        OUTPUT_LIMITS,
        "Array<{ id: string; paid: boolean; tons: number }>",
        True,
    ),
    (
        "nested-object-incomplete-part",
        closed({"a": obj({"b": S})}, ["a"]),
        OUTPUT_LIMITS,
        "{ a: { b?: string } }",
        False,
    ),
]


@pytest.mark.parametrize(
    ("schema", "limits", "text", "complete"),
    [case[1:] for case in RENDER_CASES],
    ids=[case[0] for case in RENDER_CASES],
)
def test_render_hint(schema: Any, limits: Any, text: str, complete: bool) -> None:
    assert render_hint(schema, 0, limits) == Hint(text, complete)


def test_render_case_table_is_large_enough() -> None:
    assert len(RENDER_CASES) >= 25


DEEP = obj({"a": obj({"b": obj({"c": obj({"d": S})})})})

INPUT_CASES: list[tuple[str, Any, str]] = [
    ("absent", None, "unknown"),
    ("not-an-object", [1], "unknown"),
    ("object-entry-at-depth-0", obj({"path": S}, ["path"]), "{ path: string }"),
    ("object-entry-depth-reaches-d", DEEP, "{ a?: { b?: { c?: { d?: string } } } }"),
    ("non-object-goes-through-render", {"anyOf": [S, N]}, "string | number"),
    ("empty-schema", {}, "unknown"),
    ("incomplete-hints-are-shown", obj({"q": {"type": "array"}}), "{ q?: Array<unknown> }"),
    ("longer-than-300-is-unknown", closed({name: S for name in LONG32}, LONG32), "unknown"),
]


@pytest.mark.parametrize(("schema", "text"), [c[1:] for c in INPUT_CASES], ids=[c[0] for c in INPUT_CASES])
def test_input_hint(schema: Any, text: str) -> None:
    assert input_hint(schema) == text


def test_render_deep_object_via_render_is_one_level_deeper() -> None:
    assert render_hint(DEEP, 0, INPUT_LIMITS) == Hint("{ a?: { b?: { c?: { d?: unknown } } } }", False)


OUTPUT_CASES: list[tuple[str, Any, str | None]] = [
    ("absent", None, None),
    ("complete", closed({"text": S}, ["text"]), "{ text: string }"),
    ("incomplete", obj({"text": S}, ["text"]), None),
    ("top", {}, "unknown"),
    (
        # Two complete 518-character variants: the union is complete but 1039 characters long.
        "complete-but-over-850",
        {"anyOf": [closed({f"{p}{i:02d}" + "y" * 30: S for i in range(12)}) for p in "kq"]},
        None,
    ),
]


@pytest.mark.parametrize(("schema", "text"), [c[1:] for c in OUTPUT_CASES], ids=[c[0] for c in OUTPUT_CASES])
def test_output_hint(schema: Any, text: str | None) -> None:
    assert output_hint(schema) == text


def test_hints_are_bounded_for_hostile_input() -> None:
    wide = closed({f"k{i}": {"anyOf": [S, N, B]} for i in range(500)})
    deep: dict[str, Any] = S
    for _ in range(200):
        deep = closed({"x": deep}, ["x"])
    for schema in (wide, deep):
        assert len(input_hint(schema)) <= 300
        hint = output_hint(schema)
        assert hint is None or len(hint) <= 850
