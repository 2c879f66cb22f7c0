"""Exact texts of SPEC §14.4 (host replies seen by the guest) and §14.5 (bridge protocol).

Part of :mod:`cellblock.server.messages`, which re-exports every name here; import them from there.
Echoed guest text is cut by :func:`echo` to :data:`~cellblock.server.limits.ECHO_MAX_CHARS` characters.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from cellblock.server.limits import ECHO_MAX_CHARS, MAX_RESULT_DEPTH, MAX_SEARCH_QUERY_CHARS, MAX_VALUE_DEPTH

from ._unicode import escape_lone_surrogates

__all__ = [
    "B01",
    "B02",
    "B03",
    "B04",
    "B28",
    "b05",
    "b06",
    "b07",
    "b08",
    "b09",
    "b10",
    "b11",
    "b12",
    "b14",
    "b19",
    "b23",
    "b24",
    "b25",
    "b26",
    "b29",
    "echo",
    "not_json",
    "p01",
    "p02",
    "p03",
    "p04",
    "p05",
]


def echo(text: str) -> str:
    r"""Cuts echoed guest text to at most 200 characters and makes it encodable.

    Args:
        text: Text taken from the guest (a path, id, name or selector), possibly decoded
            from JSON with lone UTF-16 surrogates in it.

    Returns:
        The first 200 code points of ``text`` (all of it when shorter), each lone surrogate
        then written as ``\uXXXX`` (SPEC §0.3 item 7), so the message always encodes as UTF-8.
    """
    return escape_lone_surrogates(text[:ECHO_MAX_CHARS])


# §14.4 Host replies seen by the guest (rejected promises).

B01 = "tools.search query must be a string."
B02 = "tools.search options must be an object."
B03 = "tools.search limit must be a positive integer."
B28 = f"tools.search query is longer than {MAX_SEARCH_QUERY_CHARS} characters; search with a few words."
B04 = "tools.describe id must be a string."


def b05(helper: Literal["tools.call", "tools.callValue"]) -> str:
    """Returns [B05]: the id given to ``tools.call`` or ``tools.callValue`` is not a string."""
    return f"{helper} id must be a string."


def b06(name: str, ids: Sequence[str]) -> str:
    """Returns [B06]: a name matches several guest-view entries.

    Args:
        name: The requested name (guest text, cut to 200 characters here).
        ids: Every matching id, in id order.
    """
    shown = ", ".join(ids[:3]) + (", ..." if len(ids) > 3 else "")
    return (
        f'Ambiguous tool name "{echo(name)}": it matches {len(ids)} tools ({shown}). '
        "Use an exact tool id."
    )


def b07(text: str, suggestions: Sequence[str]) -> str:
    """Returns [B07]: the id text names no guest-view entry.

    Args:
        text: The requested id text (guest text, cut to 200 characters here).
        suggestions: Up to three suggestion texts; empty for none.
    """
    hint = f" Did you mean: {', '.join(suggestions)}?" if suggestions else ""
    return (
        f"Unknown tool: {echo(text)}.{hint} Find tools with tools.search, inspect one with "
        "tools.describe, then call it with its exact id or name."
    )


def b08(tool_id: str) -> str:
    """Returns [B08]: a ``host`` reply's ``details`` do not match its ``outputSchema``."""
    return f'Tool "{tool_id}" returned details that do not match its declared outputSchema.'


def b09(tool_id: str, reason: str) -> str:
    """Returns [B09]: policy, approval or a hook blocked the call."""
    return f'Tool "{tool_id}" was blocked before execution: {reason}'


def b10(tool_id: str, problems: str) -> str:
    """Returns [B10]: the input does not match a ``host`` entry's ``parameters``.

    Args:
        tool_id: The resolved catalog id (or the guest path of a namespace call).
        problems: ``missing required argument(s): ...`` and/or ``unexpected argument(s): ...``
            joined by ``; ``, or ``<JSON pointer>: <problem>``.
    """
    return f'Tool "{tool_id}" input does not match its parameters: {problems}.'


def b11(tool_id: str) -> str:
    """Returns [B11]: a failed tool result without a message."""
    return f'Tool "{echo(tool_id)}" failed without an error message.'


def b12(tool_id: str, result_bytes: int, inbox_bytes: int) -> str:
    """Returns [B12]: a tool result larger than the reply inbox."""
    return f'Tool "{echo(tool_id)}" returned {result_bytes} bytes, more than this cell accepts ({inbox_bytes} bytes); ask for less data.'


def b29(tool_id: str) -> str:
    """[B29]: a runtime's tool result nested deeper than ``MAX_RESULT_DEPTH`` (its ``details`` deeper than the value nesting bound, SPEC §8.8 rule 7); not delivered."""
    return f'Tool "{echo(tool_id)}" returned a result nested deeper than {MAX_RESULT_DEPTH} levels of arrays and objects; ask for flatter data.'


def not_json(tool_id: str) -> str:
    """Returns the text for a runtime's tool result that is not valid JSON (cellblock's own, no SPEC id)."""
    return f'Tool "{echo(tool_id)}" returned a result that is not valid JSON.'


def b14(path: str) -> str:
    """Returns [B14] for a namespace call whose argument is not one plain object.

    Args:
        path: The guest path, such as ``MCP.github.createIssue``; cut to 200 characters.
    """
    return f"{echo(path)} takes a single object argument."


def b19(tool_id: str) -> str:
    """Returns [B19] for a nested call cancelled before it returned (``tool_id``: the catalog id or guest path, cut to 200 characters)."""
    return f'Tool "{echo(tool_id)}" was cancelled before it returned.'


def b24(max_pending_tool_calls: int) -> str:
    """[B24]: the host's own count of pending nested calls (``maxPendingToolCalls``) refused this one."""
    return f"too many pending tool calls (limit {max_pending_tool_calls}); the host refused this call. Await some before starting more."


def b23(method: str) -> str:
    """[B23]: the bridge request ``method`` nests deeper than the cell or the host serialises (the controller writes the same text)."""
    return f"this {method} request is nested too deeply for the bridge (at most {MAX_VALUE_DEPTH} levels of arrays and objects); send flatter data."


def b25(method: str, size: int, budget_ms: int) -> str:
    """[B25]: a long ``method`` request's JSON (``size`` characters) was not checked within ``budget_ms`` (SPEC §2.3)."""
    return f"this {method} request's {size} characters of JSON could not be checked within the host's {budget_ms} ms budget; send less data."


def b26(tool_id: str, size: int, budget_ms: int) -> str:
    """[B26]: a tool's long result (``size`` characters) was not read within ``budget_ms`` (SPEC §2.3)."""
    return f'Tool "{echo(tool_id)}" returned {size} characters of JSON, more than the host could read within its {budget_ms} ms budget; ask for less data.'


# §14.5 Bridge protocol (logged as errors; the request is rejected).


def p01(method: str) -> str:
    """[P01]: an unsupported bridge method; ``method`` is the guest's text, cut to 200 characters."""
    return f"unsupported bridge method: {echo(method)}"


def p02(bridge_id: str) -> str:
    """[P02]: a malformed bridge id (or refused range); ``bridge_id`` is the guest's text, cut to 200 characters."""
    return f"invalid bridge id: {echo(bridge_id)}"


def p03(bridge_id: str) -> str:
    """[P03]: a reused bridge id (at or below the method's counter); the guest's text, cut to 200 characters."""
    return f"duplicate bridge id: {echo(bridge_id)}"


def p05(bridge_id: str) -> str:
    """[P05]: a request whose arguments are not a JSON array; ``bridge_id`` cut to 200 characters."""
    return f"invalid bridge arguments: {echo(bridge_id)} (its arguments are not a JSON array)"


def p04(path: str) -> str:
    """Returns [P04] for an unknown namespace path.

    Args:
        path: The guest path; cut to 200 characters.
    """
    return f"unknown namespace path: {echo(path)}"
