"""Identifiers of the ``MCP`` namespace (SPEC §8.5 items 2-3).

Used for server identifiers in the exec description (SPEC §4.5) and reusable for the
namespace itself: :func:`assign_identifiers` with :data:`TOOL_RESERVED` gives tool names.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = [
    "JS_RESERVED_WORDS",
    "SERVER_RESERVED",
    "TOOL_RESERVED",
    "assign_identifiers",
    "server_identifiers",
    "to_identifier",
]

_SEPARATORS = re.compile(r"[^A-Za-z0-9]+")

JS_RESERVED_WORDS: frozenset[str] = frozenset(
    {
        "await", "break", "case", "catch", "class", "const", "continue", "debugger", "default",
        "delete", "do", "else", "enum", "export", "extends", "false", "finally", "for", "function",
        "if", "implements", "import", "in", "instanceof", "interface", "let", "new", "null",
        "package", "private", "protected", "public", "return", "static", "super", "switch", "this",
        "throw", "true", "try", "typeof", "var", "void", "while", "with", "yield",
    }
)  # fmt: skip
"""ECMAScript reserved words, including strict-mode and future reserved words."""

_RESERVED_EVERYWHERE = JS_RESERVED_WORDS | {"__proto__", "constructor", "prototype"}

SERVER_RESERVED: frozenset[str] = _RESERVED_EVERYWHERE | {
    "ALL_TOOLS", "tools", "MCP", "API", "namespaces", "text", "json", "console",
    "yield_control", "setTimeout", "clearTimeout", "$api",
}  # fmt: skip
"""Identifiers a server may not take: reserved words, the globals of SPEC §8.1 and ``$api``."""

TOOL_RESERVED: frozenset[str] = _RESERVED_EVERYWHERE | {"$api", "resources", "prompts"}
"""Identifiers a tool may not take inside its server."""


def to_identifier(name: str, fallback: str) -> str:
    """Turns a name into an identifier (SPEC §8.5 item 2).

    Args:
        name: A server or tool name, for example ``"chrome-devtools"``.
        fallback: ``"server"`` or ``"tool"``, used when nothing is left.

    Returns:
        The camel-cased identifier, for example ``chromeDevtools``.
    """
    words = [word for word in _SEPARATORS.split(name) if word]
    joined = "".join(
        (word[0].lower() if index == 0 else word[0].upper()) + word[1:] for index, word in enumerate(words)
    )
    return joined.lstrip("0123456789") or fallback


def assign_identifiers(names: Iterable[str], *, reserved: frozenset[str], fallback: str) -> list[str]:
    """Gives each name a unique identifier at one level (SPEC §8.5 item 3).

    Args:
        names: Names in processing order.
        reserved: Identifiers that are never free (:data:`SERVER_RESERVED` or
            :data:`TOOL_RESERVED`).
        fallback: ``"server"`` or ``"tool"``.

    Returns:
        One identifier per name, in the same order; a taken or reserved identifier gets
        ``2``, then ``3``, ... until free.
    """
    taken: set[str] = set()
    result = []
    for name in names:
        base = to_identifier(name, fallback)
        candidate, suffix = base, 2
        while candidate in taken or candidate in reserved:
            candidate, suffix = f"{base}{suffix}", suffix + 1
        taken.add(candidate)
        result.append(candidate)
    return result


def server_identifiers(servers: Iterable[str]) -> dict[str, str]:
    """Assigns the identifiers of MCP servers, processed in server-name order (SPEC §8.5).

    Args:
        servers: Server names (owners of ``mcp`` entries); duplicates are ignored.

    Returns:
        Map of server name to identifier, in server-name order.
    """
    ordered = sorted(set(servers))
    return dict(zip(ordered, assign_identifiers(ordered, reserved=SERVER_RESERVED, fallback="server"), strict=True))
