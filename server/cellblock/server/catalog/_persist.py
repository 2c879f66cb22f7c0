"""Catalog views as JSON documents, so a suspended run keeps its view in the run store (SPEC §10.7 item 2).

A stored view keeps each entry's registered fields and its computed hints
exactly as the run saw them; validators are compiled again from the stored
schemas on restore (compilation is deterministic).
"""

from __future__ import annotations

from typing import Any

from ._catalog import CatalogCounters, CatalogView
from ._contracts import compile_schema
from ._entries import CatalogEntry

__all__ = ["entry_from_state", "entry_state", "view_from_state", "view_state"]

_FIELDS = ("id", "source", "owner", "name", "label", "description", "parameters", "output_schema", "replay_safe", "side_effecting", "operation", "input_hint", "output_hint")


def entry_state(entry: CatalogEntry) -> dict[str, Any]:
    """An entry's fields as JSON data (validators excluded)."""
    return {name: getattr(entry, name) for name in _FIELDS}


def entry_from_state(state: dict[str, Any]) -> CatalogEntry:
    """Rebuilds an entry; a ``host`` entry's validators are compiled from its stored schemas.

    Raises:
        ValueError: A stored schema no longer compiles.
    """
    fields: dict[str, Any] = {name: state.get(name) for name in _FIELDS}
    host = fields["source"] == "host"
    return CatalogEntry(
        **fields,
        input_validator=compile_schema(fields["parameters"], "parameters") if host and fields["parameters"] is not None else None,
        output_validator=compile_schema(fields["output_schema"], "outputSchema") if host and fields["output_schema"] is not None else None,
    )


def view_state(view: CatalogView) -> dict[str, Any]:
    """A view's entries and its catalog session (``counterScope`` and counters)."""
    snap = view.counters.snapshot()
    return {
        "entries": [entry_state(e) for e in view.entries],
        "counterScope": snap.counter_scope,
        "counts": {"search": snap.search_count, "describe": snap.describe_count, "call": snap.call_count},
    }


def view_from_state(state: dict[str, Any], counters: CatalogCounters | None = None) -> CatalogView:
    """Rebuilds a view.

    Args:
        state: A :func:`view_state` document.
        counters: The live session to count in when this replica has it (same
            ``counterScope``); otherwise the stored session is restored.
    """
    if counters is None:
        counts = state.get("counts", {})
        counters = CatalogCounters.restored(state["counterScope"], int(counts.get("search", 0)), int(counts.get("describe", 0)), int(counts.get("call", 0)))
    return CatalogView([entry_from_state(e) for e in state["entries"]], counters)
