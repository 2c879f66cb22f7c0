"""MCP for real (issue #5): third-party MCP servers behind ``MCP.*``, both routes.

A service of its own (127.0.0.1:0, Docker executor, real cells) hosts three MCP servers
nobody here wrote, configured like an operator would (SPEC §3.2 item 7):

- ``@modelcontextprotocol/server-everything`` (npm) over streamable HTTP, started by the test;
- ``@modelcontextprotocol/server-memory`` (npm) over stdio;
- ``mcp-server-time`` (PyPI) over stdio.

The caller-served route registers another server-memory's tools with PutCatalog; the test
acts as the runtime and forwards each ``ToolCall`` to that server with the MCP SDK.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import docker
import pytest
import pytest_asyncio
from mcp import Client, StdioServerParameters

from cellblock.client import CellblockClient, LimitOverrides, Scope, Tool
from cellblock.server.app import ServerSettings, Service, start_service
from cellblock.server.cells import DockerExecutor
from cellblock.server.mcp import parse_mcp_servers
from tests.support.cells import cell_dirs, state_dir_in

pytestmark = pytest.mark.asyncio(loop_scope="session")

ROOT = Path(__file__).resolve().parents[2]
EVERYTHING = ROOT / "node_modules/@modelcontextprotocol/server-everything/dist/index.js"
MEMORY = ROOT / "node_modules/@modelcontextprotocol/server-memory/dist/index.js"
IMAGE = os.environ.get("CELLBLOCK_IMAGE", "cellblock-cell:dev")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def everything_url() -> Iterator[str]:
    """server-everything over streamable HTTP on a free local port."""
    if not EVERYTHING.exists():
        pytest.fail("run `npm install` (root package.json pins @modelcontextprotocol/server-everything)")
    port = _free_port()
    proc = subprocess.Popen(["node", str(EVERYTHING), "streamableHttp"], env={**os.environ, "PORT": str(port)}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    break
            except OSError:
                if proc.poll() is not None:
                    pytest.fail(f"server-everything exited with {proc.returncode}")
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture(scope="module")
def memory_dir() -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="cellblock-mcp-memory-") as d:
        yield d


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def mcp_service(everything_url: str, memory_dir: str) -> AsyncIterator[Service]:
    client = docker.from_env()
    try:
        client.images.get(IMAGE)
    except Exception as exc:  # noqa: BLE001
        pytest.fail(f"integration tests need a Docker engine and {IMAGE}; run `make image` ({exc})")
    finally:
        client.close()
    servers = parse_mcp_servers(
        json.dumps(
            {
                "everything": {"url": everything_url},
                "memory": {"command": ["node", str(MEMORY)], "env": {"MEMORY_FILE_PATH": os.path.join(memory_dir, "hosted.jsonl")}},
                "time": {"command": [sys.executable, "-m", "mcp_server_time", "--local-timezone", "UTC"]},
            }
        )
    )
    with tempfile.TemporaryDirectory(prefix="cellblock-mcp-cells-") as sockets:
        settings = ServerSettings(address="127.0.0.1:0", executor="docker", image=IMAGE, code_mode={"enabled": True, "timeoutMs": 15000}, socket_dir=sockets, state_dir=state_dir_in(sockets), mcp_servers=servers)
        svc = await start_service(settings)
        try:
            assert svc.state.mcp_hub is not None and svc.state.mcp_hub.server_names == ["everything", "memory", "time"]
            yield svc
        finally:
            await svc.stop()
            await asyncio.sleep(0.2)
            executor = svc.executor
            assert isinstance(executor, DockerExecutor)
            assert executor.list_cell_containers() == []
            assert cell_dirs(sockets) == []


@pytest_asyncio.fixture(loop_scope="session")
async def mcp_client(mcp_service: Service) -> AsyncIterator[CellblockClient]:
    async with await CellblockClient.connect(mcp_service.address) as c:
        yield c


HOST_TOOLS = [Tool(source="host", name="note", description="Keep a note.", parameters={"type": "object", "properties": {"text": {"type": "string"}}})]

KNOWLEDGE_GRAPH = """
const decl = await API.read("mcp/%(server)s.d.ts");
const listed = (await API.list("mcp")).files.map((f) => f.path);
const created = await MCP.%(server)s.createEntities({ entities: [
  { name: "Ada Lovelace", entityType: "person", observations: ["wrote the first program", "born 1815"] },
  { name: "Analytical Engine", entityType: "machine", observations: ["designed by Babbage"] },
  { name: "Charles Babbage", entityType: "person", observations: ["born 1791"] },
] });
await MCP.%(server)s.createRelations({ relations: [
  { from: "Ada Lovelace", to: "Analytical Engine", relationType: "programmed" },
  { from: "Charles Babbage", to: "Analytical Engine", relationType: "designed" },
] });
const graph = await MCP.%(server)s.readGraph();
const ada = await MCP.%(server)s.openNodes({ names: ["Ada Lovelace"] });
const g = graph.structuredContent ?? JSON.parse(graph.content[0].text);
const a = ada.structuredContent ?? JSON.parse(ada.content[0].text);
const people = g.entities.filter((e) => e.entityType === "person").map((e) => e.name).sort();
const intoEngine = g.relations.filter((r) => r.to === "Analytical Engine").map((r) => r.from + " " + r.relationType).sort();
const births = g.entities.flatMap((e) => e.observations).filter((o) => o.startsWith("born")).map((o) => Number(o.slice(5)));
return {
  declares: ["createEntities", "createRelations", "readGraph", "openNodes"].filter((f) => decl.content.includes("function " + f + "(")),
  listed,
  createdIsError: created.isError ?? false,
  people,
  intoEngine,
  yearsApart: Math.max(...births) - Math.min(...births),
  adaObservations: a.entities[0].observations.length,
};
"""


def kg_expected(server: str) -> dict[str, Any]:
    return {
        "declares": ["createEntities", "createRelations", "readGraph", "openNodes"],
        "createdIsError": False,
        "people": ["Ada Lovelace", "Charles Babbage"],
        "intoEngine": ["Ada Lovelace programmed", "Charles Babbage designed"],
        "yearsApart": 24,
        "adaObservations": 2,
    }


async def test_hosted_servers_join_every_catalog(mcp_client: CellblockClient, scope: Scope) -> None:
    catalog = await mcp_client.put_catalog(scope, HOST_TOOLS)
    ids = [e.id for e in catalog.entries]
    assert "host:core:note" in ids
    for expected in ("mcp:memory:create_entities", "mcp:memory:read_graph", "mcp:time:get_current_time", "mcp:everything:get-sum", "mcp:everything:resources/read", "mcp:everything:prompts/get"):
        assert expected in ids
    assert catalog.telemetry.mcp_count == sum(1 for i in ids if i.startswith("mcp:"))


async def test_hosted_knowledge_graph_time_and_sum(mcp_client: CellblockClient, scope: Scope) -> None:
    await mcp_client.put_catalog(scope, HOST_TOOLS)
    code = KNOWLEDGE_GRAPH % {"server": "memory"} + "\n"
    code = code.replace(
        "return {",
        'const sum = await MCP.everything.getSum({ a: 19, b: 23 });\n'
        'const now = await MCP.time.getCurrentTime({ timezone: "UTC" });\n'
        'const echoed = await MCP.everything.echo({ message: "cellblock" });\n'
        "return {\n  sumText: sum.content[0].text, nowZone: now.structuredContent.timezone, year: Number(now.structuredContent.datetime.slice(0, 4)),\n"
        "  echoed: echoed.content[0].text, allTools: ALL_TOOLS.some((t) => t.source === 'mcp'), viaTools: typeof tools.create_entities,",
        1,
    )
    result = await mcp_client.exec(scope, tool_call_id="mcp-hosted-1", code=code, handlers={})
    assert result.status == "completed", result.raw_json
    value = result.value
    assert value["listed"] == ["mcp/index.d.ts", "mcp/everything.d.ts", "mcp/memory.d.ts", "mcp/time.d.ts"]
    assert {k: value[k] for k in kg_expected("memory")} == kg_expected("memory")
    assert "42" in value["sumText"]
    assert value["nowZone"] == "UTC" and value["year"] >= 2025
    assert "cellblock" in value["echoed"]
    assert value["allTools"] is False and value["viaTools"] == "undefined", "mcp entries must not reach tools.* or ALL_TOOLS"
    # 4 memory calls + sum + time + echo, each counted once like runtime calls (SPEC §8.3 item 5).
    assert result.telemetry.call_count == 7


async def test_hosted_declarations_and_api_helpers(mcp_client: CellblockClient, scope: Scope) -> None:
    await mcp_client.put_catalog(scope, HOST_TOOLS)
    code = """
    const root = await MCP.$api();
    const one = await MCP.time.$api("get_current_time", { schema: true });
    const file = await API.read("mcp/time.d.ts");
    const index = await API.read("mcp/index.d.ts");
    return { servers: root.servers, scope: one.scope, method: one.tools[0].method, schemaKeys: Object.keys(one.schemas),
             required: one.schemas.getCurrentTime.required, file: file.content, index: index.content, bytes: file.bytes };
    """
    result = await mcp_client.exec(scope, tool_call_id="mcp-api-1", code=code, handlers={})
    assert result.status == "completed", result.raw_json
    v = result.value
    assert [s["identifier"] for s in v["servers"]] == ["everything", "memory", "time"]
    assert v["scope"] == "tool" and v["method"] == "getCurrentTime" and v["schemaKeys"] == ["getCurrentTime"] and v["required"] == ["timezone"]
    assert "declare namespace MCP.time {" in v["file"]
    assert "  function getCurrentTime(input: {\n" in v["file"]
    assert "    timezone: string;\n" in v["file"]
    assert "  function convertTime(input: {\n" in v["file"]
    assert v["bytes"] == len(v["file"].encode("utf-8"))
    assert v["index"].startswith('/// <reference path="./everything.d.ts" />\n')
    assert "  readonly time: typeof MCP.time;\n" in v["index"]
    assert result.telemetry.call_count == 0, "API and $api make no bridge requests"


async def test_hosted_argument_rules_and_error_results(mcp_client: CellblockClient, scope: Scope) -> None:
    await mcp_client.put_catalog(scope, HOST_TOOLS)
    code = """
    const out = [];
    for (const f of [() => MCP.time.getCurrentTime("UTC"), () => MCP.time.getCurrentTime({}, {}), () => MCP.time.getCurrentTime()]) {
      try { await f(); out.push("ok"); } catch (e) { out.push(e.message); }
    }
    const bad = await MCP.time.getCurrentTime({ timezone: "Not/AZone" });
    out.push(bad.isError === true);
    return out;
    """
    result = await mcp_client.exec(scope, tool_call_id="mcp-args-1", code=code, handlers={})
    assert result.status == "completed", result.raw_json
    assert result.value == [
        "MCP.time.getCurrentTime takes a single object argument.",
        "MCP.time.getCurrentTime takes a single object argument.",
        "MCP.time.getCurrentTime is missing required argument(s): timezone.",
        True,
    ]
    assert result.telemetry.call_count == 4, "refused namespace calls count too"
    uncaught = await mcp_client.exec(scope, tool_call_id="mcp-args-2", code="await MCP.memory.createEntities({});", handlers={})
    assert uncaught.status == "failed" and uncaught.code == "invalid_input" and uncaught.failure_phase == "bridge"
    assert uncaught.error.startswith("Error: MCP.memory.createEntities is missing required argument(s): entities.")


async def test_denied_hosted_tools_are_absent_and_surface_follows(mcp_client: CellblockClient, scope: Scope) -> None:
    catalog = await mcp_client.put_catalog(scope, HOST_TOOLS)
    mcp_ids = [e.id for e in catalog.entries if e.id.startswith("mcp:")]
    with_mcp = await mcp_client.tool_surface(scope)
    exec_desc = next(t.description for t in with_mcp.tools if t.name == "exec")
    assert "MCP tools are reachable only through the `MCP` namespace" in exec_desc
    assert "Namespace globals:\n- MCP: MCP server tools grouped by server. Visible servers: everything, memory, time." in exec_desc
    assert "create_entities" not in exec_desc and "knowledge graph" not in exec_desc.lower()
    await mcp_client.put_catalog(scope, HOST_TOOLS, deny=mcp_ids)
    without = await mcp_client.tool_surface(scope)
    exec_desc = next(t.description for t in without.tools if t.name == "exec")
    assert "MCP tools are reachable" not in exec_desc and "Namespace globals" not in exec_desc
    result = await mcp_client.exec(scope, tool_call_id="mcp-deny-1", code="return [typeof MCP, (await API.list()).files.length]", handlers={})
    assert result.status == "completed" and result.value == ["undefined", 0]


async def test_caller_served_mcp_tools(mcp_client: CellblockClient, scope: Scope, memory_dir: str) -> None:
    # The runtime's own MCP client to its own server-memory; entered and left in this task
    # (the SDK's transports are anyio task groups).
    params = StdioServerParameters(command="node", args=[str(MEMORY)], env={"MEMORY_FILE_PATH": os.path.join(memory_dir, "caller.jsonl")})
    async with Client(params, mode="legacy", cache=None) as caller_memory:
        await _caller_served(mcp_client, scope, caller_memory)


async def _caller_served(mcp_client: CellblockClient, scope: Scope, caller_memory: Client) -> None:
    listing = await caller_memory.list_tools()
    tools = [Tool(source="mcp", owner="kg", name=t.name, description=t.description or "", parameters=t.input_schema) for t in listing.tools]
    await mcp_client.put_catalog(scope, [*HOST_TOOLS, *tools])
    seen: list[tuple[str, str, str]] = []

    async def forward(tool_input: dict[str, Any], call: Any) -> dict[str, Any]:
        seen.append((call.catalog_id, call.method, call.source))
        result = await caller_memory.call_tool(call.name, tool_input)
        data: dict[str, Any] = result.model_dump(mode="json", by_alias=True, exclude_none=True)
        data.pop("resultType", None)
        return data

    handlers = {f"mcp:kg:{t.name}": forward for t in listing.tools}
    result = await mcp_client.exec(scope, tool_call_id="mcp-caller-1", code=KNOWLEDGE_GRAPH % {"server": "kg"}, handlers=handlers)
    assert result.status == "completed", result.raw_json
    assert {k: result.value[k] for k in kg_expected("kg")} == kg_expected("kg")
    assert "mcp/kg.d.ts" in result.value["listed"]
    assert seen == [
        ("mcp:kg:create_entities", "namespace", "mcp"),
        ("mcp:kg:create_relations", "namespace", "mcp"),
        ("mcp:kg:read_graph", "namespace", "mcp"),
        ("mcp:kg:open_nodes", "namespace", "mcp"),
    ]
    assert result.telemetry.call_count == 4


async def test_hosted_call_settles_across_waits(mcp_client: CellblockClient, scope: Scope) -> None:
    """A hosted call still running when the leg parks settles on the parked run; a wait delivers it."""
    await mcp_client.put_catalog(scope, HOST_TOOLS)
    code = """
    const r = await MCP.everything.triggerLongRunningOperation({ duration: 3, steps: 3 });
    return { types: r.content.map((c) => c.type), text: r.content[0].text };
    """
    result = await mcp_client.exec(scope, tool_call_id="mcp-wait-1", code=code, handlers={}, limits=LimitOverrides(timeout_ms=1000))
    assert result.status == "waiting", result.raw_json
    assert [p.method for p in result.pending_tool_calls] == ["namespace"]
    waits = 0
    while result.status == "waiting" and waits < 10:
        waits += 1
        assert result.run_id is not None
        result = await mcp_client.wait(scope, tool_call_id=f"mcp-wait-1w{waits}", run_id=result.run_id, handlers={})
    assert result.status == "completed", result.raw_json
    assert result.value["types"] == ["text"] and "3" in result.value["text"]
    assert result.telemetry.call_count == 1


async def test_caller_cannot_shadow_a_hosted_server(mcp_client: CellblockClient, scope: Scope) -> None:
    from cellblock.client import InvalidArgumentError

    shadow = Tool(source="mcp", owner="time", name="get_current_time", description="CALLER VERSION")
    with pytest.raises(InvalidArgumentError, match="owner 'time' is an MCP server hosted by this cellblock service"):
        await mcp_client.put_catalog(scope, [Tool(source="host", name="noop"), shadow])
    with pytest.raises(InvalidArgumentError, match=r"tool 0 \(mcp:time:get_current_time\): owner 'time'"):
        await mcp_client.put_catalog(scope, [shadow], mode="merge")


async def test_hosted_mcp_client_spans_nest_under_their_tool_call(mcp_client: CellblockClient, scope: Scope) -> None:
    from opentelemetry import trace as otel_trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = otel_trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        otel_trace.set_tracer_provider(provider)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    try:
        await mcp_client.put_catalog(scope, [Tool(source="host", name="noop")])
        result = await mcp_client.exec(scope, tool_call_id="span-nest", code='return (await MCP.time.getCurrentTime({timezone: "UTC"})).isError ?? false;', handlers={})
        assert result.status == "completed", result.raw_json
        await asyncio.sleep(0.2)
        spans = exporter.get_finished_spans()
        tool_calls = {s.context.span_id: s for s in spans if s.name == "bridge.tool_call" and s.context.trace_id == int(result.trace_id, 16)}
        assert tool_calls, [s.name for s in spans]
        sdk_spans = [s for s in spans if s.context.trace_id == int(result.trace_id, 16) and "tools/call" in s.name]
        assert sdk_spans, "the MCP SDK emitted no span for the hosted call"
        assert all(s.parent is not None and s.parent.span_id in tool_calls for s in sdk_spans), [(s.name, s.parent) for s in sdk_spans]
    finally:
        exporter.shutdown()
