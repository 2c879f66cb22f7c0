"""A scope with a huge ``mcp`` input schema keeps running at the default memory limit, or is refused up front (issue 11).

Real service, real cells. A 3 MB schema used to make every exec of its scope, even
``return 1``, fail R09 (the cell needed more than its 64 MiB to install the catalog); the guest
now parses schemas lazily and it runs. A 13.6 MB schema (a 30 MB guest catalog) still did:
registration now refuses a catalog whose guest data a cell at the default limit cannot
install ([C04], SPEC §3.2 item 8), and the scope keeps its previous catalog.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from cellblock.client import CellblockClient, CellblockError, Scope, Tool

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


async def test_a_catalog_a_cell_cannot_install_is_refused_at_registration_and_the_scope_keeps_running(client: CellblockClient, scope: Scope) -> None:
    await client.put_catalog(scope, [Tool(source="mcp", owner="small", name="one")])
    huge = Tool(source="mcp", owner="big", name="wide", parameters=_wide_schema(100_000))  # 8.5 MB of schema, 18.7 MB of guest catalog
    with pytest.raises(CellblockError, match=r"registration refused: the catalog's guest data would be \d+ bytes, more than the 16777216 bytes a cell installs at the default memory limit; register fewer or smaller tool schemas\. Nothing was applied\."):
        await client.put_catalog(scope, [huge], mode="merge")
    result = await client.exec(scope, tool_call_id="after", code="return 1", handlers={})
    assert result.status == "completed" and result.value == 1, (result.error, result.raw_json[:500])
    assert '"catalogSize":1,' in result.raw_json, result.raw_json  # the earlier catalog, unchanged
