"""A scope holding an ``mcp`` tool with a 3 MB input schema keeps running at the default memory limit (issue 11).

Real service, real cells. Before the guest parsed schemas lazily, every exec of such a scope,
even ``return 1``, failed R09 (the cell needed more than its 64 MiB to install the catalog).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from cellblock.client import CellblockClient, Scope, Tool

pytestmark = pytest.mark.asyncio(loop_scope="session")


def _wide_schema(properties: int) -> dict[str, Any]:
    return {"type": "object", "properties": {f"p{i}": {"type": "string", "description": "x" * 20, "minLength": 1} for i in range(properties)}}


async def test_a_3_mb_untrusted_schema_leaves_its_scope_running_at_the_default_memory_limit(client: CellblockClient, scope: Scope) -> None:
    schema = _wide_schema(41_000)
    assert len(json.dumps(schema)) > 3_000_000
    await client.put_catalog(scope, [Tool(source="mcp", owner="big", name="wide", parameters=schema)])
    for n in range(2):
        result = await client.exec(scope, tool_call_id=f"one{n}", code="return 1", handlers={})
        assert result.status == "completed" and result.value == 1, (result.error, result.raw_json[:500])
    # The tool's schema still answers in the cell.
    result = await client.exec(scope, tool_call_id="schema", code='const d = await MCP.big.$api("wide", { schema: true }); return Object.keys(Object.values(d.schemas)[0].properties).length', handlers={})
    assert result.status == "completed" and result.value == 41_000, (result.error, result.raw_json[:500])
