"""Convenience names ``tools.<safeName>`` (SPEC §7.7)."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence

from ._entries import CatalogEntry

__all__ = ["RESERVED_CONVENIENCE_NAMES", "convenience_names", "normalise_tool_name"]

_UNSAFE = re.compile(r"[^A-Za-z0-9_$]")

RESERVED_CONVENIENCE_NAMES: frozenset[str] = frozenset(
    {
        "search",
        "describe",
        "call",
        "callValue",
        "__proto__",
        "constructor",
        "prototype",
        # Own property names of Object.prototype.
        "__defineGetter__",
        "__defineSetter__",
        "__lookupGetter__",
        "__lookupSetter__",
        "hasOwnProperty",
        "isPrototypeOf",
        "propertyIsEnumerable",
        "toLocaleString",
        "toString",
        "valueOf",
    }
)
"""Names never installed as convenience functions (plus any starting with ``__cellblock``)."""


def normalise_tool_name(name: str) -> str:
    """Normalises a tool name to a safe identifier (SPEC §7.7 item 1).

    Args:
        name: The tool name, for example ``"read-file"`` or ``"2fa"``.

    Returns:
        Every character outside ``[A-Za-z0-9_$]`` replaced by ``_``, with the prefix
        ``tool_`` when the result starts with a digit: ``read_file``, ``tool_2fa``.
    """
    safe = _UNSAFE.sub("_", name)
    return f"tool_{safe}" if safe[:1].isdigit() and safe[:1].isascii() else safe


def convenience_names(guest: Sequence[CatalogEntry]) -> dict[str, str]:
    """Lists the convenience functions to install (SPEC §7.7 items 2-4).

    Args:
        guest: The guest-view entries, in id order.

    Returns:
        Map of normalised name to the exact catalog id it calls with ``callValue``, in id
        order; names shared by several entries or reserved are left out.
    """
    normalised = [(normalise_tool_name(entry.name), entry.id) for entry in guest]
    counts = Counter(name for name, _ in normalised)
    return {
        name: entry_id
        for name, entry_id in normalised
        if counts[name] == 1 and name not in RESERVED_CONVENIENCE_NAMES and not name.startswith("__cellblock")
    }
