"""Input and output contracts of ``host`` entries (SPEC §3.2 item 3, §8.4).

Host schemas are compiled once at registration with :func:`compile_schema`; the compiled
validators treat ``nullable: true`` as allowing ``null`` (SPEC §8.4 item 4).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import jsonschema
import jsonschema.validators
from jsonschema.exceptions import SchemaError, ValidationError

from .. import messages as msg
from ..limits import CONTRACT_BUDGET_MS, LISTED_NAMES_MAX
from ._bounded import ContractBudgetExceeded, LinearRe, SizedLru, UnsupportedPatternError, budget, budgeted, install, is_fault, schema_problem
from ._errors import BridgeReplyError
from ._fast_accept import quick_acceptor
from ._meta_accept import accepts as metaschema_accepts
from ._text import compact_json

if TYPE_CHECKING:
    from jsonschema.protocols import Validator

    from ._entries import CatalogEntry

__all__ = ["check_input_contract", "check_output_contract", "compile_schema"]

_BASE_DRAFTS: dict[str, Any] = {
    "http://json-schema.org/draft-03/schema": jsonschema.Draft3Validator,
    "http://json-schema.org/draft-04/schema": jsonschema.Draft4Validator,
    "http://json-schema.org/draft-06/schema": jsonschema.Draft6Validator,
    "http://json-schema.org/draft-07/schema": jsonschema.Draft7Validator,
    "https://json-schema.org/draft/2019-09/schema": jsonschema.Draft201909Validator,
    "https://json-schema.org/draft/2020-12/schema": jsonschema.Draft202012Validator,
}
_DEFAULT_DRAFT = "https://json-schema.org/draft/2020-12/schema"

KeywordFn = Callable[[Any, Any, Any, Any], Iterator[ValidationError] | None]


def _nullable(keyword: KeywordFn) -> KeywordFn:
    """Wraps a keyword so that ``null`` passes where the schema says ``nullable: true``."""

    def check(validator: Any, value: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
        if instance is None and isinstance(schema, Mapping) and schema.get("nullable") is True:
            return
        errors = keyword(validator, value, instance, schema)
        if errors is not None:
            yield from errors

    return check


#: Longest pattern Python's ``re`` may keep in its module cache (512 entries, not bounded by size).
_RE_CACHED_CHARS = 1024


def _is_regex(instance: object) -> bool:
    """The metaschemas' ``format: regex`` check, without filling Python's ``re`` cache with long patterns.

    jsonschema checks it with ``re.compile``, whose cache keeps the last 512 compiled patterns
    whatever their size: 512 patterns of 20 KB held 36 MiB in every worker after their catalogs
    were deleted. A pattern RE2 compiles (the engine contracts run on) is a regex; the rest
    (lookaround, backreferences) are compiled by ``re``, and purged from its cache when long.
    """
    if not isinstance(instance, str):
        return True
    try:
        LinearRe.compile(instance)
        return True
    except UnsupportedPatternError:
        pass
    try:
        re.compile(instance)
    except re.error:
        return False
    finally:
        if len(instance) > _RE_CACHED_CHARS:
            re.purge()
    return True


def _format_checker(base: Any) -> jsonschema.FormatChecker:
    """``base``'s metaschema format checker with ``regex`` checked by :func:`_is_regex`."""
    checker = jsonschema.FormatChecker()
    checker.checkers = dict(base.FORMAT_CHECKER.checkers)
    checker.checkers["regex"] = (_is_regex, ())
    return checker


def _extend(base: Any) -> Any:
    wrapped = {name: budgeted(_nullable(fn) if name in ("type", "enum", "const") else fn) for name, fn in base.VALIDATORS.items()}
    return jsonschema.validators.extend(base, validators=wrapped)


install()  # patterns on RE2 (linear time), see ._bounded


_DRAFTS: dict[str, Any] = {uri: _extend(base) for uri, base in _BASE_DRAFTS.items()}
_FORMAT_CHECKERS: dict[str, jsonschema.FormatChecker] = {uri: _format_checker(base) for uri, base in _BASE_DRAFTS.items()}


def compile_schema(schema: object, field: str, *, check: bool = True) -> Validator:
    """Compiles a trusted ``host`` schema (SPEC §3.2 item 3).

    Args:
        schema: The JSON Schema (a JSON object or boolean). Draft 2020-12 applies unless
            ``$schema`` names draft 3, 4, 6, 7 or 2019-09.
        field: The registration field name, used in problem texts (``parameters``,
            ``outputSchema``).
        check: Check the schema against its metaschema and its ``$ref`` targets; ``False``
            only for a schema a worker process already checked (the check is the costly part).

    Returns:
        A validator that treats ``nullable: true`` as allowing ``null``.

    Raises:
        ValueError: The schema does not compile; the message is the registration problem.
    """
    uri = _DEFAULT_DRAFT
    if isinstance(schema, Mapping) and "$schema" in schema:
        named = schema["$schema"]
        normalised = named[:-1] if isinstance(named, str) and named.endswith("#") else named
        if not isinstance(normalised, str) or normalised not in _DRAFTS:
            raise ValueError(f"{field} names an unsupported $schema: {compact_json(named)[:200]}")
        uri = normalised
    cls = _DRAFTS[uri]
    if not check:
        return cls(schema)
    problem = schema_problem(schema) or _metaschema_problem(uri, cls, schema)
    if problem is not None:
        raise ValueError(f"{field} is not a valid JSON Schema: {problem}")
    validator: Validator = cls(schema)
    ref_problem = _unresolvable_ref(validator, schema)
    if ref_problem is not None:
        raise ValueError(f"{field} is not a valid JSON Schema: {ref_problem}")
    return validator


def _refs(node: object) -> Iterator[str]:
    """Yields every ``$ref`` string in a schema, depth first."""
    if isinstance(node, Mapping):
        ref = node.get("$ref")
        if isinstance(ref, str):
            yield ref
        for value in node.values():
            yield from _refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from _refs(value)


def _unresolvable_ref(validator: Any, schema: object) -> str | None:
    """Returns why a ``$ref`` cannot be resolved inside the schema, or ``None``.

    References resolve only within the registered schema (and the metaschemas
    jsonschema ships); cellblock never fetches a remote schema, so such a
    reference would fail every call and is refused at registration instead.
    """
    resolver = validator._resolver  # jsonschema 4.26: the referencing resolver of this schema
    for ref in _refs(schema):
        try:
            resolver.lookup(ref)
        except Exception:  # noqa: BLE001 - any lookup failure (unresolvable, remote) refuses the schema
            return f"$ref {compact_json(ref)[:200]} does not resolve inside the schema"
    return None


# Checking a schema against its metaschema with jsonschema costs 2-20 ms; a draft 2020-12 schema
# (the default) is accepted by ._meta_accept first (about 30 times faster), and the full check runs
# only for the schemas that leaves over (invalid ones, other drafts, rare keywords). Their results
# are remembered by the schema's JSON text (runtimes re-register the same schemas on every turn):
# at most 4,096 and 4 MiB of text together.
_CHECKED = SizedLru[str | None](max_entries=4096, max_size=4 << 20)


def _metaschema_problem(uri: str, cls: Any, schema: object) -> str | None:
    """Returns why ``schema`` fails its metaschema (``<pointer>: <message>``), or ``None``."""
    if uri == _DEFAULT_DRAFT and metaschema_accepts(schema, _FORMAT_CHECKERS[uri]):
        return None
    try:
        key: tuple[str, str] | None = (uri, json.dumps(schema, ensure_ascii=False, allow_nan=False))
    except (TypeError, ValueError):
        key = None
    if key is not None:
        found, cached = _CHECKED.get(key)
        if found:
            return cached
    try:
        cls.check_schema(schema, format_checker=_FORMAT_CHECKERS[uri])
        problem = None
    except SchemaError as error:
        problem = f"{_pointer(error.absolute_path)}: {error.message[:200]}"
    if key is not None:
        _CHECKED.put(key, problem, len(key[1]))
    return problem


def _pointer(path: Any) -> str:
    """Renders a path as a JSON pointer; the root is written ``/``."""
    parts = [str(part).replace("~", "~0").replace("/", "~1") for part in path]
    return "/" + "/".join(parts)


def _json_list(values: Any, limit: int = 120) -> str | None:
    try:
        text = compact_json(values)
    except TypeError:
        return None
    return text if len(text) <= limit else None


def _number(value: Any) -> str:
    try:
        return compact_json(value)
    except TypeError:
        return str(value)


def _extra_properties(instance: Mapping[str, Any], schema: Mapping[str, Any]) -> list[str]:
    properties = schema.get("properties")
    declared = properties if isinstance(properties, Mapping) else {}
    patterns_raw = schema.get("patternProperties")
    patterns = list(patterns_raw) if isinstance(patterns_raw, Mapping) else []
    extras = []
    for key in instance:
        if key in declared:
            continue
        if any(_search(pattern, key) for pattern in patterns):
            continue
        extras.append(key)
    return extras


def _search(pattern: str, text: str) -> bool:
    try:
        return LinearRe.search(pattern, text) is not None
    except ValueError:
        return False


def _type_problem(value: object, schema: Mapping[str, Any]) -> str:
    """The ``type`` problem: the allowed types (``null`` too under ``nullable``)."""
    types = [value] if isinstance(value, str) else [str(item) for item in value] if isinstance(value, list) else []
    if schema.get("nullable") is True and "null" not in types:
        types.append("null")
    return "must be " + " or ".join(types) if types else "has the wrong type"


def _property_problem(keyword: str, value: object, schema: Mapping[str, Any], instance: object) -> str | None:
    """The ``required``/``additionalProperties`` problem naming the first property, else ``None``."""
    if keyword == "required" and isinstance(instance, Mapping) and isinstance(value, list):
        missing = [name for name in value if isinstance(name, str) and name not in instance]
        if missing:
            return f"missing required property {compact_json(missing[0])}"
    if keyword == "additionalProperties" and isinstance(instance, Mapping):
        extras = _extra_properties(instance, schema)
        if extras:
            return f"unexpected property {compact_json(extras[0][:200])}"
    return None


def _problem(error: ValidationError) -> str:
    """Describes one validation error in words."""
    keyword = error.validator
    value: Any = error.validator_value
    schema: Any = error.schema if isinstance(error.schema, Mapping) else {}
    if keyword == "type":
        return _type_problem(value, schema)
    if keyword == "enum":
        listed = _json_list(value)
        return f"must be one of {listed}" if listed else "must be one of the allowed values"
    if keyword == "const":
        shown = _json_list(value)
        return f"must equal {shown}" if shown else "must equal the allowed value"
    named = _property_problem(keyword, value, schema, error.instance)
    if named is not None:
        return named
    bounds = {
        "minLength": "must have at least {} characters",
        "maxLength": "must have at most {} characters",
        "minItems": "must have at least {} items",
        "maxItems": "must have at most {} items",
        "minProperties": "must have at least {} properties",
        "maxProperties": "must have at most {} properties",
        "exclusiveMinimum": "must be > {}",
        "exclusiveMaximum": "must be < {}",
        "multipleOf": "must be a multiple of {}",
    }
    if keyword in bounds and not isinstance(value, bool):
        return bounds[keyword].format(_number(value))
    if keyword == "minimum":
        return f"must be {'>' if schema.get('exclusiveMinimum') is True else '>='} {_number(value)}"
    if keyword == "maximum":
        return f"must be {'<' if schema.get('exclusiveMaximum') is True else '<='} {_number(value)}"
    texts = {
        "pattern": f"must match the pattern {compact_json(value) if isinstance(value, str) else ''}",
        "uniqueItems": "must not contain duplicate items",
        "anyOf": "must match at least one allowed schema",
        "oneOf": "must match exactly one allowed schema",
        "not": "must not match the excluded schema",
        "contains": "must contain a matching item",
        "propertyNames": "has a property name that is not allowed",
        "dependentRequired": "is missing a property that another property requires",
        "dependencies": "does not satisfy its property dependencies",
    }
    if keyword in texts:
        return texts[keyword].rstrip()
    if keyword is None:
        return "is not allowed here"
    return f"does not satisfy {json.dumps(str(keyword))}"


def _listed(names: list[str]) -> str:
    """Joins the first :data:`LISTED_NAMES_MAX` names, each cut by ``msg.echo``, adding ``, ...`` when there are more."""
    shown = ", ".join(msg.echo(name) for name in names[:LISTED_NAMES_MAX])
    return shown + (", ..." if len(names) > LISTED_NAMES_MAX else "")


def _top_level_problems(schema: object, arguments: object) -> str:
    """Lists missing, then unexpected, top-level arguments (SPEC §8.4 item 1)."""
    if not isinstance(schema, Mapping) or not isinstance(arguments, Mapping):
        return ""
    problems = []
    required = schema.get("required")
    if isinstance(required, list):
        missing: list[str] = []
        for name in required:
            if isinstance(name, str) and name not in arguments and name not in missing:
                missing.append(name)
        if missing:
            problems.append("missing required argument(s): " + _listed(missing))
    if schema.get("additionalProperties") is False:
        extras = _extra_properties(arguments, schema)
        if extras:
            problems.append("unexpected argument(s): " + _listed(extras))
    return "; ".join(problems)


def check_input_contract(entry: CatalogEntry, arguments: object) -> None:
    """Checks a nested call's input against a ``host`` entry's ``parameters`` (SPEC §8.4 item 1).

    Missing required top-level arguments are listed first (schema order), then unexpected
    top-level arguments when ``additionalProperties`` is ``false`` (input order); otherwise the
    first other violation is named as ``<JSON pointer>: <problem>`` (the root is ``/``).

    Args:
        entry: The resolved catalog entry; entries other than ``host`` entries with
            ``parameters`` pass unchecked.
        arguments: The call's input as a JSON value (``{}`` when the guest gave none).

    Raises:
        BridgeReplyError: [B10] with input provenance and ``code = "input_contract"``.
    """
    validator = entry.input_validator
    if validator is None:
        return
    accept = quick_acceptor(validator)
    if accept is not None and accept(arguments):
        return  # a flat typed object the full check would accept too (._fast_accept)
    try:
        with budget():
            first = next(iter(validator.iter_errors(arguments)), None)
    except ContractBudgetExceeded:
        problems = f"/: checking this input against the parameters schema took longer than {CONTRACT_BUDGET_MS} ms; send a smaller input"
    except BaseException as exc:  # unresolvable $ref, bad regex, deep recursion (a Rust extension's panic too)
        if not is_fault(exc):
            raise
        problems = "/: the parameters schema could not be evaluated for this input"
    else:
        if first is None:
            return
        problems = _top_level_problems(entry.parameters, arguments) or (
            f"{msg.echo(_pointer(first.absolute_path))}: {_problem(first)}"
        )
    raise BridgeReplyError(msg.b10(entry.id, problems), "input", code="input_contract")


def check_output_contract(entry: CatalogEntry, result: object) -> None:
    """Checks a tool result's ``details`` against a ``host`` entry's ``outputSchema`` (SPEC §8.4 item 2).

    Args:
        entry: The resolved catalog entry; entries without a compiled ``outputSchema`` pass.
        result: The runtime's tool result (normally an object with ``details``).

    Raises:
        BridgeReplyError: [B08] (not input provenance) when the result has no own
            ``details`` key or its ``details`` do not match. The value is never shown.
    """
    validator = entry.output_validator
    if validator is None:
        return
    valid = False
    if isinstance(result, Mapping) and "details" in result:
        try:
            with budget():
                valid = validator.is_valid(result["details"])
        except BaseException as exc:  # an unevaluable schema (or one over its budget) is a mismatch
            if not is_fault(exc):
                raise
            valid = False
    if not valid:
        raise BridgeReplyError(msg.b08(entry.id), "internal")
