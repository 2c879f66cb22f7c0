"""Exact texts of the host replies the guest sees (SPEC §14.4, [B01]–[B10])."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from ._text import cut_echo

__all__ = [
    "b01_search_query",
    "b02_search_options",
    "b03_search_limit",
    "b04_describe_id",
    "b05_call_id",
    "b06_ambiguous",
    "b07_unknown",
    "b08_output_contract",
    "b09_blocked",
    "b10_input_contract",
]


def b01_search_query() -> str:
    """[B01]: the ``tools.search`` query is not a string."""
    return "tools.search query must be a string."


def b02_search_options() -> str:
    """[B02]: the ``tools.search`` options are not an object."""
    return "tools.search options must be an object."


def b03_search_limit() -> str:
    """[B03]: ``options.limit`` is not a positive integer."""
    return "tools.search limit must be a positive integer."


def b04_describe_id() -> str:
    """[B04]: the ``tools.describe`` id is not a string."""
    return "tools.describe id must be a string."


def b05_call_id(helper: Literal["tools.call", "tools.callValue"]) -> str:
    """[B05]: the id given to ``tools.call`` or ``tools.callValue`` is not a string."""
    return f"{helper} id must be a string."


def b06_ambiguous(name: str, ids: Sequence[str]) -> str:
    """[B06]: a name matches several guest-view entries.

    Args:
        name: The requested name (guest text, cut to 200 characters here).
        ids: Every matching id, in id order.
    """
    shown = ", ".join(ids[:3]) + (", ..." if len(ids) > 3 else "")
    return (
        f'Ambiguous tool name "{cut_echo(name)}": it matches {len(ids)} tools ({shown}). '
        "Use an exact tool id."
    )


def b07_unknown(text: str, suggestions: Sequence[str]) -> str:
    """[B07]: the id text names no guest-view entry.

    Args:
        text: The requested id text (guest text, cut to 200 characters here).
        suggestions: Up to three suggestion texts; empty for none.
    """
    hint = f" Did you mean: {', '.join(suggestions)}?" if suggestions else ""
    return (
        f"Unknown tool: {cut_echo(text)}.{hint} Find tools with tools.search, inspect one with "
        "tools.describe, then call it with its exact id or name."
    )


def b08_output_contract(tool_id: str) -> str:
    """[B08]: a ``host`` reply's ``details`` do not match its ``outputSchema``."""
    return f'Tool "{tool_id}" returned details that do not match its declared outputSchema.'


def b09_blocked(tool_id: str, reason: str) -> str:
    """[B09]: policy, approval or a hook blocked the call."""
    return f'Tool "{tool_id}" was blocked before execution: {reason}'


def b10_input_contract(tool_id: str, problems: str) -> str:
    """[B10]: the input does not match a ``host`` entry's ``parameters``.

    Args:
        tool_id: The resolved catalog id (or the guest path of a namespace call).
        problems: ``missing required argument(s): ...`` and/or ``unexpected argument(s): ...``
            joined by ``; ``, or ``<JSON pointer>: <problem>``.
    """
    return f'Tool "{tool_id}" input does not match its parameters: {problems}.'
