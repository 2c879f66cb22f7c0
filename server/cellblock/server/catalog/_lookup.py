"""Resolving id texts in the guest view, with suggestions for unknown ids (SPEC §7.6)."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from typing import Literal

from .. import messages as msg
from ..limits import UNKNOWN_ID_SUGGESTIONS
from ._entries import CatalogEntry
from ._errors import BridgeReplyError

__all__ = ["GuestLookup", "Helper"]

Helper = Literal["tools.describe", "tools.call", "tools.callValue"]

_NEEDLE_TOKEN = re.compile(r"[a-z0-9]+")


class GuestLookup:
    """Resolves id texts against one guest view; immutable once built."""

    def __init__(self, guest: Sequence[CatalogEntry]) -> None:
        """Indexes the guest view.

        Args:
            guest: The guest-view entries, in id order.
        """
        self._guest = tuple(guest)
        self._by_id = {entry.id: entry for entry in self._guest}
        self._by_name: dict[str, list[CatalogEntry]] = {}
        for entry in self._guest:
            self._by_name.setdefault(entry.name, []).append(entry)
        self._name_counts = Counter(entry.name for entry in self._guest)

    def resolve(self, text: object, helper: Helper = "tools.call") -> CatalogEntry:
        """Resolves an id text: exact id first, else exact name (SPEC §7.6 item 1).

        Args:
            text: The guest's id argument.
            helper: The guest helper, which selects the type-check message.

        Returns:
            The guest-view entry.

        Raises:
            BridgeReplyError: [B04] (describe) or [B05] (call, callValue) with input
                provenance when ``text`` is not a string; [B06] for an ambiguous name and
                [B07] for an unknown text, without input provenance.
        """
        if not isinstance(text, str):
            message = msg.B04 if helper == "tools.describe" else msg.b05(helper)
            raise BridgeReplyError(message, "input")
        entry = self._by_id.get(text)
        if entry is not None:
            return entry
        matches = self._by_name.get(text, [])
        if len(matches) == 1:
            return matches[0]
        if matches:
            raise BridgeReplyError(msg.b06(text, [e.id for e in matches]), "internal")
        raise BridgeReplyError(msg.b07(text, self.suggestions(text)), "internal")

    def suggestions(self, text: str) -> list[str]:
        """Returns up to three suggestions for an unknown id text (SPEC §7.6 items 2-3).

        Args:
            text: The requested id text.

        Returns:
            Suggestion texts (the name when unique in the guest view, else the id), best
            first; empty for ``mcp`` ids (texts starting with ``mcp:``).
        """
        if text.startswith("mcp:"):
            return []
        needle = text.lower()
        needle_tokens = list(dict.fromkeys(_NEEDLE_TOKEN.findall(needle)))
        scored: list[tuple[int, str]] = []
        for entry in self._guest:
            name = entry.name.lower()
            entry_id = entry.id.lower()
            score = 0
            if name in needle or needle in entry_id:
                score += 40
            if name in needle_tokens:
                score += 40
            entry_tokens = set(_NEEDLE_TOKEN.findall(name)) | set(_NEEDLE_TOKEN.findall(entry_id))
            score += 12 * sum(1 for token in needle_tokens if token in entry_tokens)
            if needle in (entry.label or "").lower() or needle in entry.description.lower():
                score += 8
            if score > 0:
                shown = entry.name if self._name_counts[entry.name] == 1 else entry.id
                scored.append((score, shown))
        scored.sort(key=lambda item: (-item[0], item[1]))
        picked: list[str] = []
        for _, shown in scored:
            if shown not in picked:
                picked.append(shown)
            if len(picked) == UNKNOWN_ID_SUGGESTIONS:
                break
        return picked
