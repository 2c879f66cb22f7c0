"""Reads a :class:`~cellblock.guest._vm.CellVM`'s outbox as one tuple per bridge message.

Tests of the controller look at requests and output one by one; the outbox
carries refusal floods as ranges, which this expands.
"""

from __future__ import annotations

from typing import Any

from cellblock.guest._vm import CellVM


def take_items(vm: CellVM) -> list[tuple[Any, ...]]:
    """Takes the outbox: ``("request", bridge_id, method, args_json, refusal)`` or ``("output", entry_json)``.

    A request the controller refused has ``args_json == ""`` and its refusal kind.
    """
    items: list[tuple[Any, ...]] = []
    for item in vm.take().items:
        if item[0] == "r":
            items.append(("request", item[1], item[2], item[3], ""))
        elif item[0] == "x":
            _, method, refusal, first, count = item
            items.extend(("request", f"bridge:{method}:{n}", method, "", refusal) for n in range(first, first + count))
        else:
            items.append(("output", item[1]))
    return items
