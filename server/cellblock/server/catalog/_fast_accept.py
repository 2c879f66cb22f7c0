"""A quick acceptance of nested-call inputs for the simplest ``parameters`` schemas (SPEC §8.4 item 1).

The full check (a jsonschema validator with the contract budget, :mod:`._contracts`) costs tens of
microseconds on the shared event loop even for ``{"n": 1}`` against a three-keyword schema, once per
nested call. Most host tools declare a flat object of typed properties; for exactly those schemas a
few dict and type tests decide. The quick test only ever *accepts*: an input it does not accept
(a violation, or anything outside what it understands) goes through the full check, which names the
problem. So it never lets through an input the full check would refuse:

* the schema is an object schema of the default draft (no ``$schema``) with only ``type: "object"``,
  ``properties``, ``required`` (a list of names), ``additionalProperties`` (a boolean) and
  annotations (``title``, ``description``);
* each property schema has only a ``type`` naming one JSON type, and annotations;
* a value is accepted for its type only when it is that Python type exactly (``integer``: an ``int``
  that is no ``bool``; ``1.0`` goes to the full check).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["quick_acceptor"]

Acceptor = Callable[[object], bool]

_ANNOTATIONS = frozenset({"title", "description"})
_TOP_KEYS = frozenset({"type", "properties", "required", "additionalProperties"}) | _ANNOTATIONS
_PROPERTY_KEYS = frozenset({"type"}) | _ANNOTATIONS
#: The Python types a JSON value of each schema type may exactly have (``bool`` is never a number).
_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "null": (type(None),),
    "object": (dict,),
    "array": (list,),
}

#: Acceptors by ``id`` of their validator, with a weak reference that drops the entry with it.
_BY_VALIDATOR: dict[int, tuple[weakref.ref[Any], Acceptor | None]] = {}


def quick_acceptor(validator: Any) -> Acceptor | None:
    """The quick acceptance test of a compiled ``parameters`` validator, or ``None`` when its schema is not simple.

    Built once per validator (catalog entries keep theirs for the catalog's life).

    Args:
        validator: A validator from :func:`._contracts.compile_schema` (its ``schema`` is read).

    Returns:
        ``accept(instance) -> bool``: True only for an input the validator accepts.
    """
    key = id(validator)
    held = _BY_VALIDATOR.get(key)
    if held is not None and held[0]() is validator:
        return held[1]
    acceptor = _compile(validator.schema)

    def forget(_ref: weakref.ref[Any]) -> None:
        _BY_VALIDATOR.pop(key, None)

    _BY_VALIDATOR[key] = (weakref.ref(validator, forget), acceptor)
    return acceptor


def _compile(schema: object) -> Acceptor | None:
    if not isinstance(schema, Mapping) or not set(schema) <= _TOP_KEYS or schema.get("type") != "object":
        return None
    required = schema.get("required", [])
    additional = schema.get("additionalProperties", True)
    if not isinstance(required, list) or not all(isinstance(name, str) for name in required) or not isinstance(additional, bool):
        return None
    typed = _typed_properties(schema.get("properties", {}))
    if typed is None:
        return None
    return _acceptor(typed, tuple(required), additional=additional)


def _typed_properties(properties: object) -> list[tuple[str, tuple[type, ...]]] | None:
    """Each property's name and accepted Python types, or ``None`` when one is not a plain ``type``."""
    if not isinstance(properties, Mapping):
        return None
    typed: list[tuple[str, tuple[type, ...]]] = []
    for name, sub in properties.items():
        if not isinstance(name, str) or not isinstance(sub, Mapping) or not set(sub) <= _PROPERTY_KEYS:
            return None
        kind = sub.get("type")
        if not isinstance(kind, str) or kind not in _TYPES:
            return None
        typed.append((name, _TYPES[kind]))
    return typed


def _acceptor(typed: list[tuple[str, tuple[type, ...]]], needed: tuple[str, ...], *, additional: bool) -> Acceptor:
    names = frozenset(name for name, _ in typed)

    def accept(instance: object) -> bool:
        if type(instance) is not dict:
            return False
        if any(name not in instance for name in needed):
            return False
        if not additional and any(key not in names for key in instance):
            return False
        return all(type(instance[name]) in types for name, types in typed if name in instance)

    return accept
