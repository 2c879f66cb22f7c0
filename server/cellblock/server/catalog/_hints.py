"""Schema hints: bounded TypeScript-style renderings of JSON Schemas (SPEC §7.4).

Hints are deterministic and bounded for any input. Only ``host`` entries get hints.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..limits import (
    HINT_PROPERTY_NAME_MAX_CHARS,
    INPUT_HINT_MAX_CHARS,
    INPUT_HINT_MAX_DEPTH,
    INPUT_HINT_MAX_PROPERTIES,
    LITERAL_UNION_MAX_CHARS,
    LITERAL_UNION_MAX_VALUES,
    OUTPUT_HINT_MAX_CHARS,
    OUTPUT_HINT_MAX_DEPTH,
    OUTPUT_HINT_MAX_PROPERTIES,
    STRUCTURAL_UNION_MAX_VARIANTS,
)
from ._text import compact_json, is_json_primitive

__all__ = [
    "INPUT_LIMITS",
    "OUTPUT_LIMITS",
    "Hint",
    "HintLimits",
    "input_hint",
    "output_hint",
    "render_hint",
]


@dataclass(frozen=True)
class HintLimits:
    """Bounds of one kind of hint (SPEC §2.3)."""

    max_chars: int
    """Longest text, in characters; object parts stop before exceeding it."""
    max_depth: int
    """Depth at which rendering gives ``unknown``."""
    max_properties: int
    """Most keys rendered per object."""


INPUT_LIMITS = HintLimits(INPUT_HINT_MAX_CHARS, INPUT_HINT_MAX_DEPTH, INPUT_HINT_MAX_PROPERTIES)
"""Limits of input hints: 300 characters, depth 4, 16 properties."""

OUTPUT_LIMITS = HintLimits(OUTPUT_HINT_MAX_CHARS, OUTPUT_HINT_MAX_DEPTH, OUTPUT_HINT_MAX_PROPERTIES)
"""Limits of output hints: 850 characters, depth 6, 20 properties."""


@dataclass(frozen=True)
class Hint:
    """A rendered hint."""

    text: str
    """TypeScript-style text, for example ``{ id: string; tags?: Array<string> }``."""
    complete: bool
    """Whether the text describes the schema exactly (no unknowns, nothing dropped)."""


_UNKNOWN = Hint("unknown", False)

# Keywords that make a node incomplete without changing its text (rule 8).
_OPAQUE_KEYWORDS = (
    "$ref",
    "$dynamicRef",
    "$recursiveRef",
    "allOf",
    "patternProperties",
    "unevaluatedProperties",
    "dependentSchemas",
    "dependencies",
    "if",
    "then",
    "else",
    "prefixItems",
    "unevaluatedItems",
)

# Keywords that may not accompany anyOf/oneOf (rule 4).
_UNION_CONFLICTS = ("const", "enum", "type", "properties", "required", "additionalProperties", "items")

_IDENTIFIER = re.compile(r"[A-Za-z_$][A-Za-z0-9_$]*")


def _literal_union(values: list[Any]) -> str | None:
    """Returns the literal union of ``values`` (rule 6), or ``None`` when they do not form one."""
    if not 1 <= len(values) <= LITERAL_UNION_MAX_VALUES:
        return None
    if not all(is_json_primitive(value) for value in values):
        return None
    texts: list[str] = []
    for value in values:
        text = compact_json(value)
        if text not in texts:
            texts.append(text)
    union = " | ".join(texts)
    return union if len(union) <= LITERAL_UNION_MAX_CHARS else None


def _has_opaque_keyword(schema: Mapping[str, Any]) -> bool:
    return any(keyword in schema for keyword in _OPAQUE_KEYWORDS)


def render_hint(schema: object, depth: int, limits: HintLimits) -> Hint:
    """Renders ``render(schema, depth)`` of SPEC §7.4.

    Args:
        schema: Any JSON value; only JSON objects (dicts) describe something.
        depth: Current nesting depth, from 0.
        limits: :data:`INPUT_LIMITS` or :data:`OUTPUT_LIMITS`.

    Returns:
        The hint text and its completeness.
    """
    if not isinstance(schema, Mapping):
        return _UNKNOWN
    if not schema:
        return Hint("unknown", True)
    hint = _render_node(schema, depth, limits)
    if hint.complete and _has_opaque_keyword(schema):
        return Hint(hint.text, False)
    return hint


def _render_node(schema: Mapping[str, Any], depth: int, limits: HintLimits) -> Hint:
    """Rules 2 to 7 of ``render``; rule 8 is applied by the caller."""
    if depth >= limits.max_depth:
        return _UNKNOWN
    if "nullable" in schema:
        nullable = schema["nullable"]
        if not isinstance(nullable, bool):
            return _UNKNOWN
        if nullable:
            # `false` is ignored; `true` needs a type to add "null" to.
            declared = schema.get("type")
            if isinstance(declared, str):
                types: list[Any] = [declared]
            elif isinstance(declared, list) and all(isinstance(item, str) for item in declared):
                types = list(declared)
            else:
                return _UNKNOWN
            if "null" not in types:
                types.append("null")
            schema = {key: value for key, value in schema.items() if key != "nullable"}
            schema["type"] = types
    if "anyOf" in schema or "oneOf" in schema:
        return _render_union(schema, depth, limits)
    if "const" in schema and is_json_primitive(schema["const"]):
        return Hint(compact_json(schema["const"]), True)
    if "enum" in schema and isinstance(schema["enum"], list):
        union = _literal_union(schema["enum"])
        if union is not None:
            return Hint(union, True)
    return _render_type(schema, depth, limits)


def _render_union(schema: Mapping[str, Any], depth: int, limits: HintLimits) -> Hint:
    if "anyOf" in schema and "oneOf" in schema:
        return _UNKNOWN
    variants = schema["anyOf"] if "anyOf" in schema else schema["oneOf"]
    if not isinstance(variants, list) or not variants or len(variants) > LITERAL_UNION_MAX_VALUES:
        return _UNKNOWN
    if any(keyword in schema for keyword in _UNION_CONFLICTS):
        return _UNKNOWN
    if all(
        isinstance(variant, Mapping) and "const" in variant and not _has_opaque_keyword(variant)
        for variant in variants
    ):
        union = _literal_union([variant["const"] for variant in variants])
        if union is not None:
            return Hint(union, True)
    if len(variants) > STRUCTURAL_UNION_MAX_VARIANTS:
        return _UNKNOWN
    return _union_of(variants, depth, limits)


def _union_of(variants: Any, depth: int, limits: HintLimits) -> Hint:
    """Renders each variant at ``depth + 1`` (SPEC §7.4 rules 4 and 7).

    An incomplete variant gives ``unknown``; else the distinct texts in order joined by `` | ``.
    """
    texts: list[str] = []
    for variant in variants:
        hint = render_hint(variant, depth + 1, limits)
        if not hint.complete:
            return _UNKNOWN
        if hint.text not in texts:
            texts.append(hint.text)
    return Hint(" | ".join(texts), True)


def _render_type(schema: Mapping[str, Any], depth: int, limits: HintLimits) -> Hint:
    declared = schema.get("type")
    if isinstance(declared, list):
        if not 1 <= len(declared) <= STRUCTURAL_UNION_MAX_VARIANTS:
            return _UNKNOWN
        if not all(isinstance(member, str) for member in declared):
            return _UNKNOWN
        return _union_of(({**schema, "type": member} for member in declared), depth, limits)
    if declared in ("integer", "number"):
        return Hint("number", True)
    if declared in ("string", "boolean", "null"):
        return Hint(str(declared), True)
    if declared == "array":
        if "items" not in schema:
            return Hint("Array<unknown>", False)
        item = render_hint(schema["items"], depth + 1, limits)
        return Hint(f"Array<{item.text}>", item.complete)
    if declared == "object":
        return render_object(schema, depth + 1, limits)
    return _UNKNOWN


def _key_text(key: str) -> str:
    return key if _IDENTIFIER.fullmatch(key) else compact_json(key)


def render_object(schema: Mapping[str, Any], depth: int, limits: HintLimits) -> Hint:
    """Renders an object schema at depth ``depth`` ("Object rendering" of SPEC §7.4).

    Args:
        schema: A JSON object schema.
        depth: The object's depth; its properties are rendered at this same depth.
        limits: :data:`INPUT_LIMITS` or :data:`OUTPUT_LIMITS`.

    Returns:
        The hint text and its completeness.
    """
    properties = schema.get("properties")
    required_raw = schema.get("required")
    required_list: list[Any] = required_raw if isinstance(required_raw, list) else []
    additional = schema.get("additionalProperties")
    closed = additional is False
    if not isinstance(properties, Mapping):
        if closed and not any(isinstance(name, str) for name in required_list):
            return Hint("{}", True)
        return Hint("{ ... }", False)

    max_name = HINT_PROPERTY_NAME_MAX_CHARS
    dropped = False
    if len(required_list) > limits.max_properties:
        dropped = True
    required: set[str] = set()
    for name in required_list[: limits.max_properties]:
        if not isinstance(name, str) or name not in properties or len(name) > max_name:
            dropped = True
        else:
            required.add(name)
    required_keys = sorted(required)

    optional_all = sorted(name for name in properties if name not in required)
    optional_fit = [name for name in optional_all if len(name) <= max_name]
    room = limits.max_properties - len(required_keys)
    optional_keys = optional_fit[:room]
    if len(optional_keys) < len(optional_all):
        dropped = True

    parts: list[str] = []
    parts_complete = True
    stopped = False
    keys = [(name, False) for name in required_keys] + [(name, True) for name in optional_keys]
    for name, optional in keys:
        value = render_hint(properties[name], depth, limits)
        part = f"{_key_text(name)}{'?' if optional else ''}: {value.text}"
        if len("{ " + "; ".join([*parts, part]) + " }") > limits.max_chars:
            stopped = True
            break
        parts.append(part)
        parts_complete = parts_complete and value.complete

    open_ended = dropped or stopped or additional is True or isinstance(additional, Mapping)
    if not parts:
        text = "{}" if not keys and not open_ended else "{ ... }"
    else:
        text = "{ " + "; ".join(parts) + ("; ..." if open_ended else "") + " }"
    complete = not dropped and not stopped and closed and parts_complete
    return Hint(text, complete)


def input_hint(parameters: object) -> str:
    """Returns the input hint of a ``host`` entry (SPEC §7.4, entry point 1).

    Args:
        parameters: The registered ``parameters`` schema, or ``None`` when absent.

    Returns:
        The hint text; ``"unknown"`` when there is no object schema or the text is longer
        than 300 characters. Incomplete hints are still returned.
    """
    if not isinstance(parameters, Mapping):
        return "unknown"
    if parameters.get("type") == "object":
        hint = render_object(parameters, 0, INPUT_LIMITS)
    else:
        hint = render_hint(parameters, 0, INPUT_LIMITS)
    return hint.text if len(hint.text) <= INPUT_LIMITS.max_chars else "unknown"


def output_hint(output_schema: object) -> str | None:
    """Returns the output hint of a ``host`` entry (SPEC §7.4, entry point 2).

    Args:
        output_schema: The registered ``outputSchema``, or ``None`` when absent.

    Returns:
        The hint text when it is complete and at most 850 characters, else ``None``
        (the quick index then shows ``-> ?``).
    """
    hint = render_hint(output_schema, 0, OUTPUT_LIMITS)
    if hint.complete and len(hint.text) <= OUTPUT_LIMITS.max_chars:
        return hint.text
    return None
