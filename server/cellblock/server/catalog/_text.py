"""Text helpers shared by the catalog: compact JSON and JavaScript trimming."""

from __future__ import annotations

import copy
import json
import math
import pickle
import re
from itertools import accumulate
from typing import Any, TypeVar

from cellblock.server.messages import escape_lone_surrogates

_T = TypeVar("_T")


def deep_copy(value: _T) -> _T:
    """A deep copy of registration data at C speed (pickle), ``copy.deepcopy`` as a fallback.

    Schemas reach megabytes; ``copy.deepcopy`` walks them in Python on the shared event
    loop (0.3 s per MB), a pickle round trip does the same work in C.
    """
    try:
        copied: _T = pickle.loads(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))  # noqa: S301 - our own bytes, never external
        return copied
    except RecursionError:
        raise ValueError("nesting is too deep to copy") from None
    except (pickle.PicklingError, TypeError, AttributeError):
        return copy.deepcopy(value)

__all__ = ["compact_json", "is_json_primitive", "js_trim", "nests_deeper", "strict_json"]

# ECMAScript WhiteSpace and LineTerminator code points, as String.prototype.trim strips them.
_JS_WHITESPACE = (
    "\u0009\u000a\u000b\u000c\u000d\u0020\u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005"
    "\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
)

_SHORT_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _not_json(constant: str) -> Any:
    raise ValueError(f"{constant} is not JSON")


_STRICT_DECODER = json.JSONDecoder(parse_constant=_not_json)


def strict_json(text: str, max_depth: int | None = None) -> Any:
    """Parses JSON text strictly (RFC 8259): ``NaN``, ``Infinity`` and ``-Infinity`` are no JSON.

    For text the service did not write (a cell's arguments, output entries and values, a
    runtime's tool result, exec arguments): a text holding one is refused like any other that
    is not JSON (SPEC §14.5), never read as a number or shown as ``null``.

    Args:
        text: The JSON text.
        max_depth: When given, the deepest nesting of arrays and objects the value may have
            (:func:`nests_deeper`, counted exactly); a value from a cell's bridge passes
            ``limits.MAX_VALUE_DEPTH`` (SPEC §8.8 rule 7, the host's second layer).

    Raises:
        ValueError: ``text`` is not JSON.
        RecursionError: ``text`` nests deeper than ``max_depth`` levels, or deeper than the
            parser can go (about 950 levels, moving with the interpreter's recursion limit):
            callers give both one outcome.
    """
    if isinstance(text, str) and not text.startswith("\ufeff"):
        # One decoder for every call (``json.loads`` with an option builds one per call).
        value = _STRICT_DECODER.decode(text)
    else:
        value = json.loads(text, parse_constant=_not_json)
    if max_depth is not None and isinstance(text, str) and nests_deeper(text, max_depth):
        raise RecursionError(f"nested deeper than {max_depth} levels")
    return value


# A chunk of bracket text whose running depth plus its openings stays within the bound is
# passed with two C-speed counts; only a chunk that could cross it is summed bracket by bracket.
_DEPTH_CHUNK = 256
# Every byte but brackets and quotes, deleted by ``bytes.translate``.
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b'[]{}"')
_STRING_WITH_BRACKETS = re.compile(rb'"[^"]*"')
# Openings as 1 and closings as -1 (read as signed bytes); a stray quote (text that is not JSON) as 0.
_BRACKET_WEIGHTS = bytes.maketrans(b'[{]}"', b"\x01\x01\xff\xff\x00")


def nests_deeper(text: str, bound: int) -> bool:
    """Tells whether JSON text nests arrays and objects deeper than ``bound`` levels.

    Counted on the text, never by recursion, so the answer is the same in every process
    and at every stack depth: ``[]`` is 1 level, ``[[]]`` 2, and brackets inside strings do
    not count. All passes are C-speed (``str.count``, ``bytes.translate``, ``replace``); only
    chunks of 256 brackets whose openings could cross the bound are summed one by one.
    Measured (2 cores): 0.2 µs for a small request's arguments (at most ``bound``
    brackets: two counts), 0.2-0.3 ms for 64 KiB of shallow objects or of strings full of
    brackets, about 2 ms for 64 KiB of brackets held just under the bound (an adversary's
    worst case; parsing that text takes 1-2 ms more).

    Args:
        text: Valid JSON text (as :func:`strict_json` read it: quotes and backslashes only
            appear as the JSON string grammar allows).
        bound: The deepest nesting allowed, levels (0 or more).

    Returns:
        True when some array or object lies more than ``bound`` levels deep.
    """
    if text.count("[") + text.count("{") <= bound:
        return False  # cannot open more levels than it has brackets
    if "\\" in text:
        # Escapes pair up from the left: escaped backslashes first, then escaped quotes.
        text = text.replace("\\\\", "").replace('\\"', "")
    brackets = text.encode("utf-8", "surrogatepass").translate(None, _NOT_STRUCTURE)
    if b'"' in brackets:
        brackets = brackets.replace(b'""', b"")  # strings without brackets, at C speed
        if b'"' in brackets:
            brackets = _STRING_WITH_BRACKETS.sub(b"", brackets)
    depth = 0
    for start in range(0, len(brackets), _DEPTH_CHUNK):
        chunk = brackets[start : start + _DEPTH_CHUNK]
        opens = chunk.count(b"[") + chunk.count(b"{")
        if depth + opens > bound:
            if depth + max(accumulate(memoryview(chunk.translate(_BRACKET_WEIGHTS)).cast("b"))) > bound:
                return True
        depth += opens - chunk.count(b"]") - chunk.count(b"}")
    return False


def js_trim(text: str) -> str:
    """Strips leading and trailing whitespace the way JavaScript's ``String.prototype.trim`` does."""
    return text.strip(_JS_WHITESPACE)


def is_json_primitive(value: object) -> bool:
    """Tells whether ``value`` is a string, a finite number, a boolean or ``None``."""
    if value is None or isinstance(value, (str, bool, int)):
        return True
    return isinstance(value, float) and math.isfinite(value)


def _string_text(text: str) -> str:
    out = ['"']
    for ch in text:
        escaped = _SHORT_ESCAPES.get(ch)
        if escaped is not None:
            out.append(escaped)
        elif ch < "\x20" or "\ud800" <= ch <= "\udfff":
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _number_text(value: float) -> str:
    """Formats a number like ECMAScript's ``Number.prototype.toString``."""
    if isinstance(value, int):
        return str(value)
    if not math.isfinite(value):
        return "null"
    if value == 0:
        return "0"
    sign = "-" if value < 0 else ""
    text = repr(abs(value))
    mantissa, _, exp_text = text.partition("e")
    exponent = int(exp_text) if exp_text else 0
    integer, _, fraction = mantissa.partition(".")
    raw = integer + fraction
    stripped = raw.lstrip("0")
    # The value is 0.<digits> * 10**point.
    point = len(integer) + exponent - (len(raw) - len(stripped))
    digits = stripped.rstrip("0") or "0"
    k = len(digits)
    if k <= point <= 21:
        body = digits + "0" * (point - k)
    elif 0 < point <= 21:
        body = digits[:point] + "." + digits[point:]
    elif -6 < point <= 0:
        body = "0." + "0" * (-point) + digits
    else:
        e = point - 1
        exp_part = f"e{'+' if e > 0 else '-'}{abs(e)}"
        body = (digits if k == 1 else digits[0] + "." + digits[1:]) + exp_part
    return sign + body


# A JSON string token of ``json.dumps`` output (unrolled loop: no backtracking).
_STRING_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
# Outside strings, the floats ``json.dumps`` writes otherwise than JavaScript: integral ones (``5.0``,
# JavaScript ``5``), exponent forms (``1e+16``, ``1e-05``; JavaScript ``10000000000000000``,
# ``0.00001``) and ``NaN`` / ``Infinity``. Any other float is ``repr``'s shortest round-trip digits
# in positional form, which is also what JavaScript writes, so it needs no walk (a float-heavy
# document of 7 MB: 680 ms of walk in Python).
_FLOAT_MARK = re.compile(r"[0-9]\.0(?![0-9])|[0-9][eE]|[NI]")
# Substrings of every such float (``5.0``, ``1e+16``, ``NaN``); found by a fast substring search,
# they tell whether strings need stripping to look for floats.
_FLOAT_SUBSTRINGS = (".0", "e+", "e-", "NaN", "Infinity")


#: ``json.dumps``'s encoder for :func:`compact_json`, built once: ``dumps`` builds a new one on every
#: call given options (a few microseconds per nested call's input, result and check, issue 15).
_COMPACT = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), check_circular=False)


def compact_json(value: Any) -> str:
    r"""Serialises a JSON value as compact JSON (SPEC §0.3 item 2), like ``JSON.stringify``.

    Non-ASCII characters stay as they are, lone surrogates become ``\uXXXX`` escapes and
    numbers are written as JavaScript writes them (``1.0`` is ``1``).

    Values reach megabytes (schemas, tool inputs, results) and this runs on the shared
    event loop, so the work is done by the C encoder of :mod:`json` (about 10x faster than
    a walk in Python, SPEC §2.3 item on loop holds); Python only touches the floats, which
    ``json.dumps`` writes differently from JavaScript.

    Args:
        value: A JSON-like value: dict with string keys, list or tuple, str, int, float,
            bool or ``None``. (An int key is written as its text, as JavaScript writes an
            object's number keys; values decoded from JSON only have string keys.)

    Returns:
        The compact JSON text.

    Raises:
        TypeError: ``value`` holds something that is not JSON-like.
        RecursionError: ``value`` is nested deeper than the interpreter's recursion limit.
    """
    text = _COMPACT.encode(value)
    if not isinstance(value, str) and any(mark in text for mark in _FLOAT_SUBSTRINGS) and _FLOAT_MARK.search(_STRING_TOKEN.sub("", text)) is not None:
        try:
            text = _COMPACT.encode(_js_floats(value))
        except _NeedsSlowPath:
            return _slow_compact_json(value)
    return escape_lone_surrogates(text)


def _js_floats(value: Any) -> Any:
    """A copy of ``value`` whose floats ``json.dumps`` writes as ``JSON.stringify`` does.

    Integral floats below 2**53 become ints, non-finite ones ``None``; a float whose
    ``repr`` differs from JavaScript's text (exponent ranges differ) raises
    :class:`_NeedsSlowPath`. Keys are checked like :func:`compact_json` checks them.
    """
    if isinstance(value, float) and not isinstance(value, bool):
        if not math.isfinite(value):
            return None
        if value.is_integer() and abs(value) < 2**53:  # exact: JavaScript writes the same digits
            return int(value)
        if repr(value) != _number_text(value):
            raise _NeedsSlowPath
        return value
    if isinstance(value, (list, tuple)):
        return [_js_floats(item) for item in value]
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"JSON object keys must be strings, not {type(key).__name__}")
            out[key] = _js_floats(item)
        return out
    return value


class _NeedsSlowPath(Exception):  # noqa: N818 - control flow
    """A float needs :func:`_number_text`; the value is written by :func:`_slow_compact_json`."""


def _slow_compact_json(value: Any) -> str:
    """:func:`compact_json` walked in Python (values with floats of exponent form only)."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, str):
        return _string_text(value)
    if isinstance(value, (int, float)):
        return _number_text(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_slow_compact_json(item) for item in value) + "]"
    if isinstance(value, dict):
        parts = []
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"JSON object keys must be strings, not {type(key).__name__}")
            parts.append(_string_text(key) + ":" + _slow_compact_json(item))
        return "{" + ",".join(parts) + "}"
    raise TypeError(f"not a JSON value: {type(value).__name__}")
