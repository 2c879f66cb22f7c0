"""PutCatalog builds a big registration's entries in slices, yielding the loop between them (SPEC §3.1 item 6)."""

from __future__ import annotations

from typing import Any

import pytest

from cellblock.server.api._catalog_service import PARSE_SLICE, parsed_in_slices
from cellblock.server.catalog import Catalog, CatalogRegistrationError
from tests.support.loop_turns import other_tenant_turns

pytestmark = pytest.mark.asyncio


def _tools(count: int) -> list[dict[str, Any]]:
    return [
        {"source": "host", "owner": "core", "name": f"t{i}", "description": f"tool {i}", "parameters": {"type": "object", "properties": {"n": {"type": "integer", "minimum": i}}}}
        for i in range(count)
    ]


async def test_slices_register_what_one_pass_registers_and_let_other_tasks_run() -> None:
    tools = _tools(PARSE_SLICE * 4 + 3)
    async with other_tenant_turns() as turns:
        parsed = await parsed_in_slices(tools)
    assert turns.count >= 4  # the loop ran other work between the slices
    sliced = Catalog().register(parsed).entries
    whole = Catalog().register(_tools(len(tools))).entries
    assert [(e.id, e.input_hint, e.parameters) for e in sliced] == [(e.id, e.input_hint, e.parameters) for e in whole]
    assert [t.index for t in parsed] == list(range(len(tools)))
    assert sliced[-1].input_validator is not None and not sliced[-1].input_validator.is_valid({"n": 0})


async def test_a_duplicate_in_a_later_slice_is_refused_with_both_indexes() -> None:
    tools = _tools(PARSE_SLICE + 2)
    tools[-1] = dict(tools[1])
    with pytest.raises(CatalogRegistrationError, match="duplicate id host:core:t1 \\(also tool 1\\)") as caught:
        await parsed_in_slices(tools)
    assert caught.value.index == PARSE_SLICE + 1
