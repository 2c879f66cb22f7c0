"""Resolving id texts in the guest view, with suggestions for unknown ids (SPEC §7.6)."""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from .. import messages as msg
from ..limits import (
    MAX_CATALOG_ID_CHARS,
    SUGGESTION_BUDGET_MS,
    SUGGESTION_CHECK_EVERY,
    SUGGESTION_DESCRIPTION_CHARS,
    UNKNOWN_ID_SUGGESTIONS,
)
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
        self._scored: list[_Scored] = []
        """The scoring texts of the first entries of the view, filled as suggestions reach them."""

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
                [B07] for an unknown text, without input provenance (with no suggestions
                when ``text`` is longer than any catalog id, SPEC §7.6 item 4).
        """
        if not isinstance(text, str):
            message = msg.B04 if helper == "tools.describe" else msg.b05(helper)
            raise BridgeReplyError(message, "input")
        if len(text) > MAX_CATALOG_ID_CHARS:
            raise BridgeReplyError(msg.b07(text, []), "internal")
        entry = self._by_id.get(text)
        if entry is not None:
            return entry
        matches = self._by_name.get(text, [])
        if len(matches) == 1:
            return matches[0]
        if matches:
            raise BridgeReplyError(msg.b06(text, [e.id for e in matches]), "internal")
        raise BridgeReplyError(msg.b07(text, self.suggestions(text)), "internal")

    def suggestions(self, text: str, budget_ms: float = SUGGESTION_BUDGET_MS) -> list[str]:
        """Returns up to three suggestions for an unknown id text (SPEC §7.6 items 2-4).

        Args:
            text: The requested id text, at most :data:`MAX_CATALOG_ID_CHARS` characters
                (:meth:`resolve` refuses longer ones first).
            budget_ms: Wall time the scoring may take, in milliseconds; when it is spent the
                entries scored so far give the suggestions.

        Returns:
            Suggestion texts (the name when unique in the guest view, else the id), best
            first; empty for ``mcp`` ids (texts starting with ``mcp:``).
        """
        if text.startswith("mcp:"):
            return []
        needle = text.lower()
        needle_tokens = frozenset(_NEEDLE_TOKEN.findall(needle))
        deadline = time.perf_counter() + budget_ms / 1000.0
        scored: list[tuple[int, str]] = []
        for index, entry in enumerate(self._guest):
            if index % SUGGESTION_CHECK_EVERY == 0 and index and time.perf_counter() > deadline:
                break
            if index == len(self._scored):
                self._scored.append(_Scored.of(entry))
            score = self._scored[index].score(needle, needle_tokens)
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


@dataclass(frozen=True)
class _Scored:
    """The lower-cased texts suggestion scoring reads of one entry (SPEC §7.6 item 2)."""

    name: str
    entry_id: str
    tokens: frozenset[str]
    """The ``[a-z0-9]`` runs of the name and the id."""
    label: str
    description: str
    """The first :data:`SUGGESTION_DESCRIPTION_CHARS` characters of the description."""

    @classmethod
    def of(cls, entry: CatalogEntry) -> _Scored:
        """Lower-cases ``entry``'s texts once per lookup."""
        name, entry_id = entry.name.lower(), entry.id.lower()
        tokens = frozenset(_NEEDLE_TOKEN.findall(name)) | frozenset(_NEEDLE_TOKEN.findall(entry_id))
        description = entry.description[:SUGGESTION_DESCRIPTION_CHARS].lower()
        return cls(name, entry_id, tokens, (entry.label or "").lower(), description)

    def score(self, needle: str, needle_tokens: frozenset[str]) -> int:
        """Scores the entry for the lower-cased ``needle`` and its distinct ``[a-z0-9]`` runs."""
        score = 40 if self.name in needle or needle in self.entry_id else 0
        if self.name in needle_tokens:
            score += 40
        score += 12 * len(needle_tokens & self.tokens)
        if needle in self.label or needle in self.description:
            score += 8
        return score
