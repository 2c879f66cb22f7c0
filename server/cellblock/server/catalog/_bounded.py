"""Bounds on evaluating contracts: linear-time patterns, a time budget, a depth cap (SPEC §2.3, §8.4).

Contracts are checked on the service's shared event loop, once per nested call, against
guest-chosen inputs, so their cost must not depend on how hostile the input is:

* Patterns (``pattern``, ``patternProperties`` and the property matching of
  ``additionalProperties``/``unevaluatedProperties``) run on RE2 (PyPI ``google-re2``),
  whose matching time is linear in the input; Python's ``re`` backtracks exponentially
  on patterns such as ``^(a+)+$``. jsonschema 4.26 calls ``re.search`` from its
  ``_keywords`` and ``_utils`` modules; :func:`install` points both at :class:`LinearRe`.
  A ``host`` schema whose patterns RE2 cannot compile (lookaround, backreferences) is
  refused at registration (:func:`schema_problem`).
* Every keyword evaluation checks a per-check deadline (:func:`budget`); a check that
  overruns stops with :class:`ContractBudgetExceeded`. The budget is CPU time of the
  checking thread (the loop's), the time the check holds the loop: on a loaded machine the
  thread can wait for a core, and wall time alone would fail a small input for the
  machine's load. The wall clock (cheap to read) decides when the CPU clock is read.
* Schemas deeper than :data:`MAX_SCHEMA_DEPTH` are refused at registration.
* A check has room for :data:`CHECK_RECURSION_FRAMES` Python frames beyond its caller's, so a
  value at the bridge's nesting bound checks against a recursive ``$ref`` schema (about 7 frames
  a level; at the interpreter's default limit of 1000 a 180-level tree failed, and inside the
  service the ``RecursionError`` surfaced in a Rust extension as a ``PanicException``, a
  ``BaseException``, that escaped every handler). :func:`is_fault` tells such a fault
  (the panic included) from cancellation.
* Compiled patterns are cached by their text (:class:`SizedLru`), bounded by the total length
  of the patterns, not only their count: 4,096 compiled RE2 objects of 20 KB patterns held
  hundreds of MiB, in the service and in each worker, after their catalogs were deleted.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator, Mapping
from typing import Any, Generic, TypeVar

import jsonschema._keywords
import jsonschema._utils
import re2

from cellblock.server.limits import CONTRACT_BUDGET_MS, MAX_SCHEMA_DEPTH

__all__ = ["CHECK_RECURSION_FRAMES", "ContractBudgetExceeded", "LinearRe", "SizedLru", "budget", "budgeted", "install", "pattern_refusal", "schema_problem", "is_fault"]


_OPTIONS = re2.Options()
_OPTIONS.log_errors = False


class ContractBudgetExceeded(Exception):  # noqa: N818 - a condition
    """A contract check used more than :data:`CONTRACT_BUDGET_MS` of the loop thread's CPU time."""


class UnsupportedPatternError(ValueError):
    """A pattern RE2 cannot compile."""


_V = TypeVar("_V")


class SizedLru(Generic[_V]):
    """A least-recently-used cache bounded by entries and by the summed size of its entries.

    Thread-safe (the loop and worker threads share it). An entry larger than a quarter of
    ``max_size`` is never kept, so one huge entry cannot flush every other one.

    Args:
        max_entries: Entries kept at most.
        max_size: Summed size (the ``size`` given to :meth:`put`, e.g. characters) kept at most.
    """

    def __init__(self, max_entries: int, max_size: int) -> None:
        self.max_entries = max_entries
        self.max_size = max_size
        self._items: OrderedDict[Hashable, tuple[_V, int]] = OrderedDict()
        self._size = 0
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> tuple[bool, _V | None]:
        """``(True, value)`` for a cached key (now the most recently used), else ``(False, None)``."""
        with self._lock:
            item = self._items.get(key)
            if item is None:
                return False, None
            self._items.move_to_end(key)
            return True, item[0]

    def put(self, key: Hashable, value: _V, size: int) -> None:
        """Keeps ``value`` under ``key`` (``size`` counted against ``max_size``), evicting the least recently used."""
        if size > self.max_size // 4:
            return
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._size -= old[1]
            self._items[key] = (value, size)
            self._size += size
            while len(self._items) > self.max_entries or self._size > self.max_size:
                _, (_, dropped) = self._items.popitem(last=False)
                self._size -= dropped

    def clear(self) -> None:
        """Drops every entry."""
        with self._lock:
            self._items.clear()
            self._size = 0

    @property
    def size(self) -> int:
        """The summed size of the entries kept."""
        return self._size

    def __len__(self) -> int:
        return len(self._items)


#: Compiled patterns kept: at most 4,096, and at most 1 MiB of pattern text together (their
#: compiled programs take about 5 times their text; a pattern over 256 KiB is compiled per use).
PATTERN_CACHE = SizedLru[Any](max_entries=4096, max_size=1 << 20)


def _compiled(pattern: str) -> Any:
    found, compiled = PATTERN_CACHE.get(pattern)
    if found:
        return compiled
    try:
        compiled = re2.compile(pattern, _OPTIONS)
    except re2.error as exc:
        raise UnsupportedPatternError(str(exc)) from None
    PATTERN_CACHE.put(pattern, compiled, len(pattern))
    return compiled


class LinearRe:
    """The part of the ``re`` module jsonschema uses, on RE2."""

    error = UnsupportedPatternError

    @staticmethod
    def compile(pattern: str) -> Any:
        """The compiled RE2 pattern (cached); raises :class:`UnsupportedPatternError` for non-RE2 syntax."""
        return _compiled(pattern)

    @staticmethod
    def search(pattern: str, string: str) -> Any:
        """``re.search`` in linear time; raises :class:`UnsupportedPatternError` for non-RE2 syntax.

        Checks the contract budget first: ``patternProperties`` and ``additionalProperties``
        match every property of the instance inside one keyword evaluation (50,000 properties
        against 20 patterns held the loop 1.2 s before the next keyword's check).
        """
        _check_deadline()
        return _compiled(pattern).search(string)


def install() -> None:
    """Points jsonschema's pattern matching at :class:`LinearRe` and ``uniqueItems`` at :func:`_uniq` (idempotent)."""
    jsonschema._keywords.re = LinearRe
    jsonschema._utils.re = LinearRe
    jsonschema._keywords.uniq = _uniq


_TRUE, _FALSE = object(), object()


def _key(value: Any) -> Any:
    """A hashable key of a JSON value: two values have equal keys iff ``jsonschema._utils.equal`` holds.

    Strings equal only strings, booleans only booleans (never ``1`` or ``0``), numbers equal by
    value (``1 == 1.0``), arrays item by item, objects by their key sets and values.
    """
    if value is True or value is False:
        return _TRUE if value else _FALSE
    if isinstance(value, str):
        return ("s", value)
    if isinstance(value, Mapping):
        return ("o", frozenset((k, _key(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return ("a", tuple(_key(v) for v in value))
    return value


def _uniq(container: Any) -> bool:
    """``uniqueItems`` in linear time: jsonschema compares unsortable items (objects, arrays) pairwise.

    One keyword evaluation, so no budget check ran inside it: 4,000 objects held the loop for
    11 s. Items too deep to key fall back to the pairwise comparison, with the budget checked
    per item.
    """
    try:
        keys = [_key(item) for item in container]
    except RecursionError:
        seen: list[Any] = []
        for item in container:
            _check_deadline()
            if any(jsonschema._utils.equal(other, item) for other in seen):
                return False
            seen.append(item)
        return True
    return len(set(keys)) == len(keys)


def _check_deadline() -> None:
    deadline = getattr(_local, "deadline", None)
    if deadline is not None and time.monotonic() > deadline[0] and time.thread_time() > deadline[1]:
        raise ContractBudgetExceeded


_local = threading.local()


#: Python frames a contract check may use beyond its caller's: jsonschema takes about 7 a level of a
#: recursive ``$ref`` schema, so a value at the bridge's nesting bound (``MAX_VALUE_DEPTH`` + 1 = 257
#: levels) needs about 1,900; twice that leaves room for schemas that take more a level. Each frame
#: costs at most a few hundred bytes of the thread's C stack (8 MiB), well within it.
CHECK_RECURSION_FRAMES = 4000


@contextlib.contextmanager
def budget(ms: int = CONTRACT_BUDGET_MS) -> Iterator[None]:
    """Runs the enclosed contract check under a budget of ``ms`` milliseconds of this thread's CPU time.

    The check overruns when both the wall clock and the thread's CPU clock have passed
    ``ms`` since the start: waiting for a core (a loaded machine) never fails a check. The
    interpreter's recursion limit is raised for the check by :data:`CHECK_RECURSION_FRAMES`
    (so at least that many frames beyond the caller's), and restored after it; the garbage collector
    waits while the check runs (the check's allocations are bounded by its budget).
    """
    previous = getattr(_local, "deadline", None)
    _local.deadline = (time.monotonic() + ms / 1000.0, time.thread_time() + ms / 1000.0)
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(limit + CHECK_RECURSION_FRAMES)  # the caller is within ``limit``: room beyond it
    # A collection of the whole heap (50-130 ms with a large catalog registered) must not be charged to
    # the check that happened to allocate: collections wait until the check has ended.
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()
        sys.setrecursionlimit(limit)
        _local.deadline = previous


def is_fault(exc: BaseException) -> bool:
    """Whether ``exc`` is a fault to report (a check that could not evaluate, a service fault), not a stop.

    Every exception is, and so is a Rust extension's ``PanicException`` (a ``BaseException``:
    ``rpds``, under ``referencing``, panics when a ``RecursionError`` is raised inside one of
    its callbacks); cancellation and interpreter exits are not. Callers catch ``BaseException``
    and re-raise what this refuses.
    """
    return not isinstance(exc, (asyncio.CancelledError, KeyboardInterrupt, SystemExit, GeneratorExit))


KeywordFn = Callable[[Any, Any, Any, Any], Any]


def budgeted(keyword: KeywordFn) -> KeywordFn:
    """Wraps a jsonschema keyword so that each evaluation first checks the deadline."""

    def check(validator: Any, value: Any, instance: Any, schema: Any) -> Iterator[Any]:
        _check_deadline()
        errors = keyword(validator, value, instance, schema)
        if errors is not None:
            yield from errors

    return check


def _re2_reason(error: str) -> str:
    """RE2's own text of a compile error (``re2.error`` carries it as the repr of bytes)."""
    if error[:2] in ("b'", 'b"') and error[-1:] == error[1]:
        error = error[2:-1]
    return error.replace("\\\\", "\\")


def pattern_refusal(pattern: str, error: str) -> str:
    """The registration problem of a pattern RE2 refused: which pattern, RE2's reason, and why it is refused.

    Args:
        pattern: The refused pattern (the first 200 characters are quoted).
        error: The ``re2.error`` text of its compilation.

    Returns:
        E.g. ``pattern '^(?=a)' is outside the linear-time engine (RE2): invalid perl operator: (?=
        (lookahead and lookbehind need backtracking); contracts match patterns in linear time only``.
    """
    reason = _re2_reason(error)
    if "invalid perl operator: (?=" in reason or "invalid perl operator: (?!" in reason or "invalid perl operator: (?<" in reason:
        kind = " (lookahead and lookbehind need backtracking)"
    elif re2.search(r"invalid escape sequence: \\[1-9]", reason):
        kind = " (backreferences need backtracking)"
    else:
        kind = " (not a pattern RE2 accepts)"
    return f"pattern {pattern[:200]!r} is outside the linear-time engine (RE2): {reason[:200]}{kind}; contracts match patterns in linear time only"


def schema_problem(schema: object, *, patterns: bool = True) -> str | None:
    """Why a schema cannot be registered under these bounds, or ``None``.

    Walks the schema iteratively (no recursion limit): deeper than
    :data:`MAX_SCHEMA_DEPTH`, or (with ``patterns``, for compiled ``host`` schemas) a
    ``pattern``/``patternProperties`` key RE2 cannot compile.
    """
    stack: list[tuple[object, int]] = [(schema, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_SCHEMA_DEPTH:
            return f"nesting is deeper than {MAX_SCHEMA_DEPTH} levels"
        if isinstance(node, Mapping):
            found = [node["pattern"]] if patterns and isinstance(node.get("pattern"), str) else []
            props = node.get("patternProperties")
            if patterns and isinstance(props, Mapping):
                found += [key for key in props if isinstance(key, str)]
            for pattern in found:
                try:
                    _compiled(pattern)
                except UnsupportedPatternError as exc:
                    return pattern_refusal(pattern, str(exc))
            stack.extend((value, depth + 1) for value in node.values())
        elif isinstance(node, list):
            stack.extend((value, depth + 1) for value in node)
    return None
