"""The quick metaschema acceptance gives the full check's outcome (SPEC §3.2 item 3, issue 11).

``_meta_accept.accepts`` may answer ``True`` only where jsonschema's ``check_schema`` accepts;
every registration outcome (accepted, or the first error's problem text) stays the full check's.
"""

from __future__ import annotations

import copy
import math
import random
from typing import Any

import jsonschema
import pytest
from jsonschema.exceptions import SchemaError
from jsonschema_specifications import REGISTRY

from cellblock.server.catalog import _contracts
from cellblock.server.catalog._meta_accept import FALLBACK_KEYWORDS, RULES, accepts

URI = "https://json-schema.org/draft/2020-12/schema"
CHECKER = _contracts._FORMAT_CHECKERS[URI]
CLS = _contracts._DRAFTS[URI]

VALID: list[Any] = [
    True,
    False,
    {},
    {"type": "object", "properties": {"a": {"type": "string", "minLength": 1, "maxLength": 2.0, "pattern": "^[a-z]+$"}}, "required": ["a"], "additionalProperties": False},
    {"type": ["string", "null"], "enum": ["x", None, 1], "default": "x", "examples": [1, {"a": []}], "nullable": True, "x-extra": {"type": 5}},
    {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 10}, {"const": {"k": [1]}}], "oneOf": [True], "allOf": [{}], "not": {"type": "null"}},
    {"type": "array", "items": {"$ref": "#/$defs/item"}, "prefixItems": [{"type": "number", "multipleOf": 0.5}], "minItems": 0, "maxItems": 3, "uniqueItems": True, "contains": {"type": "string"}, "minContains": 1, "maxContains": 2, "$defs": {"item": {"type": "string", "format": "date-time"}}},
    {"type": "object", "patternProperties": {"^x-": {"type": "string"}}, "propertyNames": {"maxLength": 5}, "dependentRequired": {"a": ["b"]}, "dependentSchemas": {"a": {"required": ["c"]}}, "minProperties": 1, "maxProperties": 9, "unevaluatedProperties": False},
    {"if": {"properties": {"a": {"const": 1}}}, "then": {"required": ["b"]}, "else": {"required": []}, "title": "t", "description": "d", "$comment": "c", "deprecated": False, "readOnly": True, "writeOnly": False},
    {"$schema": URI, "definitions": {"x": {"type": "boolean"}}, "contentEncoding": "base64", "contentMediaType": "text/plain", "contentSchema": {"type": "string"}, "exclusiveMinimum": -1, "exclusiveMaximum": 1e9, "unevaluatedItems": True},
    {"$id": "https://example.com/s", "$anchor": "a1", "dependencies": {"a": ["b"], "c": {"type": "string"}}},  # left to the full check
]

INVALID: list[Any] = [
    1,
    "string",
    None,
    [],
    {"type": "str"},
    {"type": []},
    {"type": ["string", "string"]},
    {"type": 3},
    {"properties": {"a": 1}},
    {"properties": []},
    {"required": ["a", "a"]},
    {"required": "a"},
    {"required": [1]},
    {"minLength": -1},
    {"minLength": 1.5},
    {"minLength": True},
    {"maxItems": "3"},
    {"multipleOf": 0},
    {"multipleOf": -2},
    {"minimum": "0"},
    {"minimum": True},
    {"pattern": "("},
    {"pattern": 5},
    {"patternProperties": {"(": {}}},
    {"enum": "x"},
    {"anyOf": []},
    {"allOf": {}},
    {"items": [{"type": "string"}]},
    {"uniqueItems": 1},
    {"title": 1},
    {"format": 1},
    {"$ref": 1},
    {"$defs": {"a": 1}},
    {"dependentRequired": {"a": "b"}},
    {"additionalProperties": {"type": "object", "properties": {"deep": {"type": "nope"}}}},
    {"$anchor": "1bad"},
    {"$id": "https://example.com/s#frag"},
]

JUNK: list[Any] = [1, -1, 0, 2.0, 1.5, True, False, None, "", "(", "string", "^a$", [], ["a", "a"], ["string"], [1], {}, {"type": "x"}, math.nan, math.inf]


def full_problem(schema: Any) -> str | None:
    """The problem text of jsonschema's own check, as registration words it."""
    try:
        CLS.check_schema(schema, format_checker=CHECKER)
    except SchemaError as error:
        return f"{_contracts._pointer(error.absolute_path)}: {error.message[:200]}"
    return None


def _nodes(node: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [path]
    if isinstance(node, dict):
        for key, value in node.items():
            out += _nodes(value, (*path, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            out += _nodes(value, (*path, i))
    return out


def mutations(count: int) -> list[Any]:
    """``count`` schemas made from the valid ones by replacing one value (or adding one keyword) with junk."""
    rng = random.Random(11)
    out = []
    keywords = sorted(RULES) + sorted(FALLBACK_KEYWORDS)
    while len(out) < count:
        schema = copy.deepcopy(rng.choice([s for s in VALID if isinstance(s, dict)]))
        paths = _nodes(schema)
        path = rng.choice(paths)
        parent: Any = schema
        for part in path[:-1]:
            parent = parent[part]
        if not path or rng.random() < 0.3:
            target = parent if not path else parent[path[-1]]
            if isinstance(target, dict):
                target[rng.choice(keywords)] = rng.choice(JUNK)
        else:
            parent[path[-1]] = copy.deepcopy(rng.choice(JUNK))
        out.append(schema)
    return out


def test_the_rules_name_every_keyword_the_metaschema_constrains() -> None:
    constrained = set(REGISTRY.contents(URI)["properties"])
    for vocabulary in ("core", "applicator", "unevaluated", "validation", "meta-data", "format-annotation", "content"):
        constrained |= set(REGISTRY.contents(f"https://json-schema.org/draft/2020-12/meta/{vocabulary}")["properties"])
    assert set(RULES) | FALLBACK_KEYWORDS == constrained
    assert not set(RULES) & FALLBACK_KEYWORDS


@pytest.mark.parametrize("schema", VALID[:-1], ids=range(len(VALID) - 1))
def test_common_valid_schemas_skip_the_full_check(schema: Any) -> None:
    assert full_problem(schema) is None
    assert accepts(schema, CHECKER)


@pytest.mark.parametrize("schema", VALID + INVALID + mutations(800))
def test_registration_gives_the_full_checks_outcome(schema: Any) -> None:
    expected = full_problem(schema)
    if accepts(schema, CHECKER):
        assert expected is None, schema  # sound: never accepts what the metaschema refuses
    _contracts._CHECKED.clear()
    assert _contracts._metaschema_problem(URI, CLS, schema) == expected


def test_invalid_schemas_are_never_accepted_quickly() -> None:
    for schema in INVALID:
        assert not accepts(schema, CHECKER), schema
    assert jsonschema.Draft202012Validator.META_SCHEMA["$id"] == URI
