"""``tools.search`` over the guest view (SPEC §7.5).

Ranking: entries whose id or name equals the trimmed query (case-insensitively) first, by
id; then BM25 (k1 = 1.2, b = 0.75, ``idf(t) = ln(1 + (N - df + 0.5) / (df + 0.5))``) by score
descending, ties by id. BM25 scoring uses ``bm25s``'s ``lucene`` method, whose idf is exactly
the formula above and whose term-frequency part differs from textbook BM25 only by the constant
factor ``k1 + 1``, which never changes an order; tokens are ours (``bm25s`` takes them as given).
"""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Mapping, Sequence
from typing import Any

import bm25s

from .. import messages as msg
from ..limits import BM25_B, BM25_K1, MAX_SEARCH_QUERY_CHARS
from ._entries import CatalogEntry
from ._errors import BridgeReplyError
from ._text import js_trim

__all__ = ["SearchIndex", "document_tokens", "search_limit", "search_model", "tokenize"]


def _is_word_char(ch: str) -> bool:
    return ch.isalpha() or ch.isdecimal()


def tokenize(text: str) -> list[str]:
    """Splits text into search tokens (SPEC §7.5 item 2).

    Tokens are maximal runs of Unicode letters and decimal digits, also split where a
    lower-case letter or a digit is followed by an upper-case letter, then lower-cased.

    Args:
        text: Any text, for example ``"readFile2JSON v2"``.

    Returns:
        The tokens in order, with repeats, for example ``["read", "file2", "json", "v2"]``.
    """
    tokens: list[str] = []
    current: list[str] = []
    previous = ""
    for ch in text:
        if _is_word_char(ch):
            if (
                current
                and unicodedata.category(ch) == "Lu"
                and (unicodedata.category(previous) == "Ll" or previous.isdecimal())
            ):
                tokens.append("".join(current))
                current = []
            current.append(ch)
        elif current:
            tokens.append("".join(current))
            current = []
        previous = ch
    if current:
        tokens.append("".join(current))
    return [token.lower() for token in tokens]


def document_tokens(entry: CatalogEntry) -> list[str]:
    """Returns an entry's search document (SPEC §7.5 item 3).

    Args:
        entry: A guest-view entry.

    Returns:
        Tokens of the name, id, label and description, then, for ``host`` entries, the name
        and string ``description`` of each top-level ``parameters.properties`` member.
    """
    tokens = tokenize(entry.name) + tokenize(entry.id) + tokenize(entry.label or "")
    tokens += tokenize(entry.description)
    if entry.source == "host" and isinstance(entry.parameters, Mapping):
        properties = entry.parameters.get("properties")
        if isinstance(properties, Mapping):
            for name, schema in properties.items():
                tokens += tokenize(str(name))
                if isinstance(schema, Mapping) and isinstance(schema.get("description"), str):
                    tokens += tokenize(schema["description"])
    return tokens


def search_limit(options: object, default_limit: int, max_limit: int) -> int:
    """Validates ``tools.search`` options and returns the effective limit (SPEC §7.5 item 1).

    Args:
        options: The guest's options: ``None`` (undefined or null) or a JSON object.
        default_limit: ``searchDefaultLimit`` of the configuration.
        max_limit: ``maxSearchLimit`` of the configuration.

    Returns:
        The number of results to return.

    Raises:
        BridgeReplyError: [B02] when ``options`` is not an object; [B03] when ``limit`` is
            present and not a positive integer. Both have input provenance.
    """
    if options is None:
        return default_limit
    if not isinstance(options, Mapping):
        raise BridgeReplyError(msg.B02, "input")
    if "limit" not in options:
        return default_limit
    limit: Any = options["limit"]
    valid = not isinstance(limit, bool) and (
        isinstance(limit, int) or (isinstance(limit, float) and math.isfinite(limit) and limit.is_integer())
    )
    if not valid or limit <= 0:
        raise BridgeReplyError(msg.B03, "input")
    return min(int(limit), max_limit)


def search_model(guest: Sequence[CatalogEntry]) -> Any:
    """The BM25 model of a guest view's search documents, or ``None`` when they have no tokens.

    Tokenizing costs about 80 ms per MB of descriptions, so the service builds the model in a
    worker process at registration and hands it to the view (SPEC §2.3 "loop hold"); it pickles.

    Args:
        guest: The guest-view entries, in id order (the model scores them by position).
    """
    documents = [document_tokens(entry) for entry in guest]
    if not any(documents):
        return None
    model = bm25s.BM25(method="lucene", k1=BM25_K1, b=BM25_B, dtype="float64")
    model.index(documents, show_progress=False)
    return model


_BUILD = object()


class SearchIndex:
    """A BM25 index over one guest view; immutable once built."""

    def __init__(self, guest: Sequence[CatalogEntry], model: Any = _BUILD) -> None:
        """Builds the index.

        Args:
            guest: The guest-view entries, in id order.
            model: :func:`search_model` of exactly these entries, built elsewhere (a worker
                process); by default it is built here.
        """
        self._guest = tuple(guest)
        self._model: Any = search_model(self._guest) if model is _BUILD else model

    def rank(self, query: str) -> list[CatalogEntry]:
        """Returns every result of ``query`` in rank order, before the limit is applied.

        Args:
            query: The guest's query string.

        Returns:
            The exact tier, then BM25 hits scoring above 0; the whole guest view in id order
            when the query has no tokens and no exact match.
        """
        wanted = js_trim(query).lower()
        exact = [e for e in self._guest if e.id.lower() == wanted or e.name.lower() == wanted]
        tokens = list(dict.fromkeys(tokenize(query)))
        if not tokens:
            return exact if exact else list(self._guest)
        ranked = list(exact)
        if self._model is not None:
            token_ids = self._model.get_tokens_ids(tokens)
            if token_ids:
                scores = self._model.get_scores_from_ids(token_ids)
                seen = {entry.id for entry in exact}
                hits = [i for i in range(len(self._guest)) if scores[i] > 0 and self._guest[i].id not in seen]
                # The guest view is in id order, so the position breaks ties by id.
                hits.sort(key=lambda i: (-float(scores[i]), i))
                ranked += [self._guest[i] for i in hits]
        return ranked

    def search(self, query: object, options: object, *, default_limit: int, max_limit: int) -> list[dict[str, Any]]:
        """Runs ``tools.search(query, options)`` (SPEC §7.5).

        Args:
            query: The guest's query; must be a string.
            options: The guest's options (``None`` or a JSON object with optional ``limit``).
            default_limit: ``searchDefaultLimit`` of the configuration.
            max_limit: ``maxSearchLimit`` of the configuration.

        Returns:
            Up to ``limit`` compact entries.

        Raises:
            BridgeReplyError: [B01], [B28] (a query over 4096 characters), [B02] or [B03],
                with input provenance.
        """
        if not isinstance(query, str):
            raise BridgeReplyError(msg.B01, "input")
        if len(query) > MAX_SEARCH_QUERY_CHARS:
            raise BridgeReplyError(msg.B28, "input")
        limit = search_limit(options, default_limit, max_limit)
        return [entry.compact() for entry in self.rank(query)[:limit]]
