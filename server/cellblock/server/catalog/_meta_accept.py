"""A quick, sound acceptance test of draft 2020-12 schemas against their metaschema (SPEC §3.2 item 3).

jsonschema's own metaschema check (``check_schema``) resolves the metaschema's ``$ref`` and
``$dynamicRef`` links at every node of the checked schema: 2-20 ms per tool schema, 30 s for a
registration of 1,500 host tools on a loaded machine (issue 11). Building the metaschema's
validator once does not help: the cost is the evaluation, not the construction.

:func:`accepts` walks a schema once and applies the 2020-12 metaschema's constraints keyword by
keyword (the vocabularies' ``properties``, written out below). It is sound, not complete: it
answers ``True`` only for a schema the metaschema accepts, and ``False`` for every schema it
is not sure of (an invalid one, a keyword it does not know the rule of, a value of another
Python type than JSON decoding gives); the caller then runs the full check, whose first error
is the registration problem. Keywords no vocabulary constrains (``nullable``, ``x-...``) are
accepted as the metaschema accepts them. tests/unit/catalog/test_meta_accept.py checks that the
rules below and the metaschema name the same keywords, and compares both checks on a corpus.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jsonschema

__all__ = ["FALLBACK_KEYWORDS", "RULES", "accepts"]

_SIMPLE_TYPES = frozenset({"array", "boolean", "integer", "null", "number", "object", "string"})

Rule = Callable[[Any, jsonschema.FormatChecker], bool]


def _number(value: Any) -> bool:
    """The metaschema's ``type: number`` (``bool`` is not a number)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _count(value: Any, _fmt: jsonschema.FormatChecker) -> bool:
    """``nonNegativeInteger``: ``type: integer`` (``2.0`` counts) and ``minimum: 0``."""
    return _number(value) and (isinstance(value, int) or value.is_integer()) and value >= 0


def _strings(value: Any, _fmt: jsonschema.FormatChecker) -> bool:
    """``stringArray``: an array of distinct strings."""
    return isinstance(value, list) and all(isinstance(item, str) for item in value) and len(set(value)) == len(value)


def _type(value: Any, _fmt: jsonschema.FormatChecker) -> bool:
    """``type``: a simple type, or a non-empty array of distinct simple types."""
    if isinstance(value, str):
        return value in _SIMPLE_TYPES
    return isinstance(value, list) and bool(value) and all(isinstance(item, str) and item in _SIMPLE_TYPES for item in value) and len(set(value)) == len(value)


def _conforms(value: Any, fmt: jsonschema.FormatChecker, name: str) -> bool:
    try:
        return bool(fmt.conforms(value, name))
    except Exception:  # noqa: BLE001 - the full check raises or reports it
        return False


def _schema(node: Any, fmt: jsonschema.FormatChecker) -> bool:
    """``$dynamicRef: #meta``: a boolean, or an object whose keywords each satisfy their rule."""
    if isinstance(node, bool):
        return True
    if not isinstance(node, dict):
        return False
    for key, value in node.items():
        rule = RULES.get(key)
        if rule is None:
            if key in FALLBACK_KEYWORDS:
                return False
            continue
        if not rule(value, fmt):
            return False
    return True


def _schema_map(value: Any, fmt: jsonschema.FormatChecker) -> bool:
    return isinstance(value, dict) and all(_schema(item, fmt) for item in value.values())


def _schema_array(value: Any, fmt: jsonschema.FormatChecker) -> bool:
    return isinstance(value, list) and bool(value) and all(_schema(item, fmt) for item in value)


def _pattern_properties(value: Any, fmt: jsonschema.FormatChecker) -> bool:
    return _schema_map(value, fmt) and all(_conforms(key, fmt, "regex") for key in value)


def _string(value: Any, _fmt: jsonschema.FormatChecker) -> bool:
    return isinstance(value, str)


def _boolean(value: Any, _fmt: jsonschema.FormatChecker) -> bool:
    return isinstance(value, bool)


def _any(_value: Any, _fmt: jsonschema.FormatChecker) -> bool:
    return True


def _array(value: Any, _fmt: jsonschema.FormatChecker) -> bool:
    return isinstance(value, list)


def _formatted(name: str) -> Rule:
    return lambda value, fmt: isinstance(value, str) and _conforms(value, fmt, name)


RULES: dict[str, Rule] = {
    **dict.fromkeys(
        ("items", "contains", "additionalProperties", "propertyNames", "if", "then", "else", "not", "unevaluatedItems", "unevaluatedProperties", "contentSchema"),
        _schema,
    ),
    **dict.fromkeys(("properties", "dependentSchemas", "$defs", "definitions"), _schema_map),
    **dict.fromkeys(("prefixItems", "allOf", "anyOf", "oneOf"), _schema_array),
    "patternProperties": _pattern_properties,
    "type": _type,
    **dict.fromkeys(("const", "default"), _any),
    **dict.fromkeys(("enum", "examples"), _array),
    "multipleOf": lambda value, _fmt: _number(value) and value > 0,
    **dict.fromkeys(("maximum", "exclusiveMaximum", "minimum", "exclusiveMinimum"), lambda value, _fmt: _number(value)),
    **dict.fromkeys(("maxLength", "minLength", "maxItems", "minItems", "maxContains", "minContains", "maxProperties", "minProperties"), _count),
    "pattern": _formatted("regex"),
    **dict.fromkeys(("uniqueItems", "deprecated", "readOnly", "writeOnly"), _boolean),
    "required": _strings,
    "dependentRequired": lambda value, fmt: isinstance(value, dict) and all(_strings(item, fmt) for item in value.values()),
    **dict.fromkeys(("title", "description", "format", "contentEncoding", "contentMediaType", "$comment"), _string),
    "$ref": _formatted("uri-reference"),
    "$schema": _formatted("uri"),
}
"""Per metaschema keyword, its constraint on the keyword's value."""

FALLBACK_KEYWORDS = frozenset({"$id", "$anchor", "$dynamicRef", "$dynamicAnchor", "$vocabulary", "$recursiveAnchor", "$recursiveRef", "dependencies"})
"""Keywords the metaschema constrains that :func:`accepts` leaves to the full check (rare in tool schemas)."""


def accepts(schema: object, fmt: jsonschema.FormatChecker) -> bool:
    """Whether ``schema`` surely satisfies the draft 2020-12 metaschema.

    Args:
        schema: A decoded JSON Schema (nesting already bounded by ``schema_problem``).
        fmt: The format checker the full check uses (``regex`` and the URI formats).

    Returns:
        ``True`` only when the full check (``check_schema``) accepts ``schema``; ``False`` when
        it may not (run the full check for the answer and its problem).
    """
    return _schema(schema, fmt)
