"""The quick index of ``host`` tools in the exec description (SPEC §4.4)."""

from __future__ import annotations

from collections.abc import Iterable

from ..limits import QUICK_INDEX_MAX_CHARS
from ._entries import CatalogEntry
from ._text import compact_json

__all__ = ["QUICK_INDEX_HEADING", "quick_index", "quick_index_lines"]

QUICK_INDEX_HEADING = (
    "Host tool quick index (exact ids; descriptions are intentionally deferred):\n"
    "Each line is `id input -> output`; `-> ?` means the output is unknown.\n"
    "OUTPUT DECLARED RULE: use the declared output fields directly in the first exec.\n"
    "OUTPUT UNKNOWN RULE: for `-> ?`, return the raw value unchanged and map it in a later exec."
)
"""The four heading lines of the block, joined by ``\\n``."""

_ALL_LISTED = (
    "Call these ids exactly with tools.callValue; use ALL_TOOLS or tools.search inside exec when the choice is ambiguous."
)


def _left_out_footer(count: int) -> str:
    return f"{count} more host tools are not listed here. Use ALL_TOOLS or tools.search inside exec to find them."


def _footer(left_out: int) -> str:
    return _ALL_LISTED if left_out == 0 else _left_out_footer(left_out)


def _block(lines: list[str], footer: str) -> str:
    return QUICK_INDEX_HEADING + "\n" + "\n".join(lines) + "\n\n" + footer


def quick_index_lines(entries: Iterable[CatalogEntry]) -> list[str]:
    """Returns the quick-index lines in order (SPEC §4.4 items 1-3).

    Args:
        entries: Catalog entries of any source; only ``host`` entries are listed.

    Returns:
        ``- "<id>" <input hint> -> <output hint or ?>`` lines: entries with an output hint
        first, then the rest, by id inside each group.
    """
    hosts = sorted((entry for entry in entries if entry.source == "host"), key=lambda entry: entry.id)
    ordered = [e for e in hosts if e.output_hint is not None] + [e for e in hosts if e.output_hint is None]
    return [f"- {compact_json(e.id)} {e.input_hint} -> {e.output_hint or '?'}" for e in ordered]


def quick_index(entries: Iterable[CatalogEntry], max_chars: int = QUICK_INDEX_MAX_CHARS) -> str | None:
    """Builds the quick-index block (SPEC §4.4).

    If the complete block fits ``max_chars`` it is used. Otherwise lines are taken greedily
    in order: a line is taken when the heading, the lines taken so far, this line and the
    left-out footer with ``N`` = the total line count still fit; other lines are skipped
    whole. The footer then names the real left-out count.

    Args:
        entries: Catalog entries of any source.
        max_chars: Bound of the block in characters (8000).

    Returns:
        The block, or ``None`` when there is no ``host`` entry.
    """
    lines = quick_index_lines(entries)
    if not lines:
        return None
    complete = _block(lines, _ALL_LISTED)
    if len(complete) <= max_chars:
        return complete
    sizing_footer = _left_out_footer(len(lines))
    taken: list[str] = []
    for line in lines:
        if len(_block([*taken, line], sizing_footer)) <= max_chars:
            taken.append(line)
    # If every line was taken, the complete block (longer footer) did not fit: leave lines
    # out from the end until the block with the real footer fits, so the bound always holds.
    while taken and len(_block(taken, _footer(len(lines) - len(taken)))) > max_chars:
        taken.pop()
    return _block(taken, _footer(len(lines) - len(taken)))
