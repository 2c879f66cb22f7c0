"""A scope with 1500 ``mcp`` tools runs in a cell at the default 64 MiB memory limit (issue 11, SPEC §8.6, §8.7).

Real service, real cells. Each leg's ``Start`` carried 37.7 MB of guest catalog for this catalog
(every tool's declaration five times: its server file, its server header and each of its
``$api()`` selectors), and the cell ran out of memory installing it. The guest catalog now sends
each declaration piece once; ``API.*`` and ``$api()`` still answer in the cell, with exactly the
texts the host renders (:func:`~cellblock.server.catalog._declarations.render_server`).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from cellblock.client import CellblockClient, LimitOverrides, Scope, Tool
from cellblock.server.catalog import Catalog, build_namespace
from cellblock.server.catalog._declarations import render_server
from tests.support.big_catalog import SERVERS, big_mcp_registrations

pytestmark = pytest.mark.asyncio(loop_scope="session")

REGISTRATIONS = big_mcp_registrations()
CATALOG = [Tool(**tool) for tool in REGISTRATIONS]

PROGRAM = """
const root = await MCP.$api();
const all = await MCP.server3.$api();
const one = await MCP.server3.$api("tool_action_13", { schema: true });
const byPath = await MCP.server3.$api("MCP.server3.toolAction1403");
const file = await API.read("mcp/server7.d.ts");
const index = await API.read("/mcp/index.d.ts");
const found = await tools.search("record kind 3");
return {
  root, list: await API.list(), listed: await API.list("mcp/"), file: [file.path, file.bytes, file.description, file.content],
  index: index.content, allHeader: all.header, allTools: all.tools.length, one, byPath: [byPath.scope, byPath.header],
  found: found.map((t) => t.id), allToolsGlobal: ALL_TOOLS.map((t) => t.id),
};
"""


def _expected() -> dict[str, Any]:
    """What the program must see, from the host's own rendering of the same catalog."""
    catalog = Catalog()
    catalog.register(json.loads(json.dumps(REGISTRATIONS)))
    ns = build_namespace(catalog.view.entries)
    files = ns.api_files()
    server3 = next(s for s in ns.servers if s.identifier == "server3")
    tool13 = next(t for t in server3.tools if t.mcp_tool == "tool_action_13")
    tool1403 = next(t for t in server3.tools if t.path == "MCP.server3.toolAction1403")
    return {
        "files": files,
        "server3": render_server("server3", server3.tools),
        "server3Count": len(server3.tools),
        "one": (render_server("server3", [tool13]), tool13),
        "byPath": render_server("server3", [tool1403]),
        "servers": [{"identifier": s.identifier, "serverName": s.name, "toolCount": len(s.tools)} for s in ns.servers],
    }


async def test_a_1500_tool_mcp_scope_runs_at_the_default_memory_limit_with_the_hosts_declarations(client: CellblockClient, scope: Scope) -> None:
    await client.put_catalog(scope, CATALOG)
    # The default memoryLimitBytes (64 MiB); an output budget the declarations fit in.
    result = await client.exec(scope, tool_call_id="big", code=PROGRAM, handlers={}, limits=LimitOverrides(max_output_bytes=8 << 20))
    assert result.status == "completed", (result.error, result.raw_json[:500])
    got, want = result.value, _expected()
    files = want["files"]
    assert got["list"] == {"files": [{"path": f["path"], "description": f["description"], "bytes": f["bytes"]} for f in files]}
    assert got["listed"] == got["list"] and len(files) == SERVERS + 1
    server7 = next(f for f in files if f["path"] == "mcp/server7.d.ts")
    assert got["file"] == [server7["path"], server7["bytes"], server7["description"], server7["content"]]
    assert got["index"] == files[0]["content"] == got["root"]["header"]
    assert got["root"]["servers"] == want["servers"] and got["root"]["kind"] == "mcp_api" and got["root"]["scope"] == "root"
    assert got["allHeader"] == want["server3"] and got["allTools"] == want["server3Count"]
    header, tool = want["one"]
    one = got["one"]
    assert one["scope"] == "tool" and one["header"] == header and one["server"] == {"identifier": "server3", "serverName": "server-3"}
    assert one["tools"] == [tool.summary()] and one["schemas"] == {tool.method: tool.parameters}
    assert got["byPath"] == ["tool", want["byPath"]]
    assert got["found"][0] == "host:core:lookup_3" and got["allToolsGlobal"] == [f"host:core:lookup_{k}" for k in range(5)]
