"""Megabytes of JSON between a cell and the runtime, checked in a worker process (SPEC §3.1 item 6).

A nested call's input and a tool's result pass through the host as JSON text. The host
must read them (strict JSON, nesting it can serialise, the contracts of §8.4) and write
them again compactly (§0.3), and for a dense document of 7 MB that took 230-250 ms of the
shared event loop: the C decoder and encoder hold the GIL, so a thread would not free it.
Texts longer than :data:`~cellblock.server.limits.INLINE_JSON_CHARS` are therefore read,
checked and written here, in the worker pool (:mod:`cellblock.server.workers`), within
:data:`~cellblock.server.limits.LARGE_JSON_BUDGET_MS` and the leg's deadline; the loop
gets the compact text back as a :class:`JsonText` and sends it on as it is. Shorter texts
stay on the loop: a worker hop costs more than reading them.

Every function here named ``*_in_worker`` runs in a worker process; its arguments and
results pickle (strings move at memory speed, decoded JSON would not).
:func:`read_final_value` runs in one for a long final value and on the loop for a short one.
"""

from __future__ import annotations

import dataclasses
import pickle
from dataclasses import dataclass
from typing import Any

from cellblock.server.catalog import BridgeReplyError, CatalogEntry, check_input_contract, check_output_contract, compile_schema, strict_json
from cellblock.server.limits import INLINE_JSON_CHARS, MAX_RESULT_DEPTH, MAX_VALUE_DEPTH
from cellblock.server.runs._output import JsonText, NotSerializableError, compact_json, final_marker

__all__ = ["InputCheck", "JsonText", "PreparedResult", "args_checked_in_worker", "args_in_worker", "input_check_in_worker", "final_marker_in_worker", "portable", "read_final_value", "result_in_worker"]


def _as_text(value: object) -> object:
    if isinstance(value, dict | list) or (isinstance(value, str) and len(value) > INLINE_JSON_CHARS):
        return JsonText(compact_json(value), isinstance(value, dict))
    return value


def args_in_worker(args_json: str, first_input: int) -> tuple[list[object] | None, bool]:
    """Reads a nested call's arguments as ``policy.admit_request`` does on the loop.

    Args:
        args_json: The bridge request's ``args_json``.
        first_input: Index of the tool input in the arguments (1 for ``call`` and
            ``callValue``, 2 for ``namespace``); it and every later object, array or long
            string argument come back as :class:`JsonText`, earlier ones (the id, the path)
            as values.

    Returns:
        ``(args, too_deep)``: ``args`` is ``None`` when the text is not a JSON array
        ([P05]); ``too_deep`` when it nests deeper than ``MAX_VALUE_DEPTH`` levels or than
        the host parses or serialises ([B23]).
    """
    return _read_args(args_json, first_input)[0]


def _read_args(args_json: str, first_input: int) -> tuple[tuple[list[object] | None, bool], list[object] | None]:
    """:func:`args_in_worker`'s answer, and the decoded arguments when it has some."""
    try:
        args = strict_json(args_json, MAX_VALUE_DEPTH + 1)  # each argument: the array holds them
    except RecursionError:  # deeper than the value nesting bound (or the parser): [B23]
        return ([], True), None
    except ValueError:
        return (None, False), None
    if not isinstance(args, list):
        return (None, False), None
    try:
        head = args[:first_input]
        compact_json(head)  # the id and the path: serialisable like the rest
        # The head goes back to the loop as values, so it must also pickle: an id nested
        # about 500 deep serialises as JSON but makes pickle raise RecursionError, which
        # pebble answers by killing the worker (one request per worker, all tenants').
        pickle.dumps(head, pickle.HIGHEST_PROTOCOL)
        return ([*head, *(_as_text(a) for a in args[first_input:])], False), args
    except (NotSerializableError, RecursionError):
        return ([], True), None


InputCheck = tuple[str, tuple[str, str, str | None] | None]
"""An input contract checked in the same worker call: ``(entry id, None or the [B10] reply)`` (:func:`input_check_in_worker`)."""


def args_checked_in_worker(args_json: str, first_input: int, entry: CatalogEntry) -> tuple[tuple[list[object] | None, bool], InputCheck | None]:
    """:func:`args_in_worker`, and the input's contract against ``entry`` checked on the value just read.

    A long input was read twice: once here, and again from its compact text to check its
    contract in a second worker call once the loop had resolved the entry. The leg names the
    entry its exact id (the first argument) resolves to, when it has an input contract; the leg
    uses this check only when the call resolves to that entry, with the answer the second call
    would have given.

    Args:
        args_json: As for :func:`args_in_worker`.
        first_input: As for :func:`args_in_worker`.
        entry: A :func:`portable` ``host`` entry with ``parameters``.

    Returns:
        :func:`args_in_worker`'s answer, and ``(entry.id, problem)`` when the input was read and
        checked (``problem`` as :func:`input_check_in_worker` returns it), else ``None``.
    """
    answer, args = _read_args(args_json, first_input)
    if args is None or answer[1] or len(args) <= first_input:
        return answer, None
    checked = dataclasses.replace(entry, input_validator=compile_schema(entry.parameters, "parameters", check=False))
    try:
        check_input_contract(checked, args[first_input])
    except BridgeReplyError as exc:
        return answer, (entry.id, (exc.message, exc.provenance, exc.code))
    return answer, (entry.id, None)


def read_final_value(text: str) -> JsonText | str | None:
    """Reads a cell's final value once: strict JSON, the value nesting bound, its compact JSON (SPEC §8.8 rule 7, §9 rule 6).

    The one read of the value: its compact text is what the output budget measures and what
    the result splices in, so the value is neither parsed nor serialised again.

    Args:
        text: The ``Completed`` message's ``value_json``.

    Returns:
        The value's compact JSON; a reason for [R15] when it nests deeper than
        ``MAX_VALUE_DEPTH`` levels (counted exactly, or beyond the host's parser) or cannot be
        serialised; ``None`` when it is not JSON ([R17]).
    """
    try:
        value = strict_json(text, MAX_VALUE_DEPTH)
    except RecursionError:  # deeper than the value nesting bound (or the parser): SPEC §8.8 rule 7
        return f"nesting is deeper than {MAX_VALUE_DEPTH} levels"
    except ValueError:
        return None
    try:
        return JsonText(compact_json(value), isinstance(value, dict))
    except NotSerializableError as exc:
        return str(exc)


def final_marker_in_worker(text: str, allowance: int) -> JsonText:
    """:func:`~cellblock.server.runs._output.final_marker` of a long final value, as its compact JSON.

    The marker holds up to ``allowance`` bytes of the value's text: written here, the loop splices
    it into the result as it is (serialising a 10 MiB marker there held it 50-150 ms).
    """
    return JsonText(compact_json(final_marker(text, allowance)), True)


def portable(entry: CatalogEntry) -> CatalogEntry:
    """The entry without its compiled validators, for a worker process (they do not pickle; a worker that checks compiles its own)."""
    return dataclasses.replace(entry, input_validator=None, output_validator=None)


def input_check_in_worker(entry: CatalogEntry, text: str) -> tuple[str, str, str | None] | None:
    """Checks a tool input against ``entry``'s ``parameters`` (SPEC §8.4 item 1), with the loop's own code.

    Args:
        entry: A :func:`portable` ``host`` entry with ``parameters``.
        text: The input's compact JSON.

    Returns:
        ``None`` when it matches, else the [B10] reply as ``(message, provenance, code)``.
    """
    checked = dataclasses.replace(entry, input_validator=compile_schema(entry.parameters, "parameters", check=False))
    try:
        check_input_contract(checked, strict_json(text))
    except BridgeReplyError as exc:
        return exc.message, exc.provenance, exc.code
    return None


@dataclass(frozen=True)
class PreparedResult:
    """A runtime's JSON tool result as a worker read it (:func:`result_in_worker`).

    Attributes:
        size: Its UTF-8 size in bytes (the reply inbox check, [B12]).
        valid: It is JSON the host can read and serialise; when False the guest gets the
            "not valid JSON" reply.
        result: The compact JSON of the whole result; ``""`` when :attr:`same` (it was the runtime's text).
        details: The compact JSON of its own ``details`` key when it is an object that has one, else ``None``.
        contract: For the entry id named, whether ``details`` match its ``outputSchema``
            (SPEC §8.4 item 2); ``None`` when no contract was checked.
        overran: The worker did not read it within its budget (or died): the guest gets [B26].
        too_deep: It nests deeper than ``MAX_RESULT_DEPTH`` levels (``valid`` is then False): the guest gets [B29].
        same: The compact JSON is the runtime's ``ok_json`` itself (what clients send), so the worker does
            not send it back: the pool's thread unpickled 60 MB of it holding Python's lock (SPEC §3.1 item 6).
    """

    size: int
    valid: bool
    result: str = ""
    details: str | None = None
    contract: tuple[str, bool] | None = None
    overran: bool = False
    too_deep: bool = False
    same: bool = False


def result_in_worker(ok_json: str, entry: CatalogEntry | None) -> PreparedResult:
    """Reads a tool result as ``RunCatalog.project_result`` does on the loop.

    Args:
        ok_json: The runtime's ``ok_json``.
        entry: The :func:`portable` entry called, when it has an ``outputSchema`` to check; else ``None``.
    """
    size = len(ok_json.encode("utf-8", "surrogatepass"))
    try:
        value: Any = strict_json(ok_json, MAX_RESULT_DEPTH)
        result = compact_json(value)
        details = compact_json(value["details"]) if isinstance(value, dict) and "details" in value else None
    except RecursionError:
        return PreparedResult(size, False, too_deep=True)
    except ValueError:  # NotSerializableError is a ValueError
        return PreparedResult(size, False)
    contract = None
    if entry is not None and entry.output_schema is not None:
        checked = dataclasses.replace(entry, output_validator=compile_schema(entry.output_schema, "outputSchema", check=False))
        try:
            check_output_contract(checked, value)
            contract = (entry.id, True)
        except BridgeReplyError:
            contract = (entry.id, False)
    if result == ok_json:
        return PreparedResult(size, True, "", details, contract, same=True)
    return PreparedResult(size, True, result, details, contract)
