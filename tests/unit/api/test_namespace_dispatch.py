"""Host side of ``namespace`` requests and the hosted-MCP configuration (SPEC §3.2 item 7, §8.5 item 7).

Unit level: a real catalog, a real :class:`StreamPorts` and a real :class:`RunCatalog`; no cell.
The run's catalog resolves and projects calls; the port sends them on the stream.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from cellblock.server.api._catalogs import RunCatalog
from cellblock.server.api._stream_ports import StreamPorts
from cellblock.server.app import ServerSettings
from cellblock.server.catalog import BridgeReplyError, Catalog
from cellblock.server.config import CodeModeConfig
from cellblock.server.mcp import McpServerConfig, parse_mcp_servers
from cellblock.server.runs import BridgeMethod, PendingRequest, ToolOutcome
from cellblock.v1 import code_mode_service_pb2 as pb

TOOLS: list[dict[str, Any]] = [
    {"source": "host", "name": "read"},
    {"source": "client", "name": "pick"},
    {"source": "mcp", "owner": "git-hub", "name": "create_issue", "parameters": {"type": "object", "required": ["title"], "properties": {"title": {"type": "string"}}}},
    {"source": "mcp", "owner": "git-hub", "name": "files", "operation": "resources.read"},
]


def run_catalog(tools: list[dict[str, Any]] = TOOLS) -> RunCatalog:
    catalog = Catalog()
    catalog.register(tools)
    return RunCatalog(catalog.view, CodeModeConfig.from_json({}))


def ports() -> tuple[StreamPorts, asyncio.Queue[Any]]:
    outbox: asyncio.Queue[Any] = asyncio.Queue()
    return StreamPorts(pb.ExecResponse, outbox), outbox


def test_namespace_path_resolves_to_the_exact_entry_with_its_guest_path() -> None:
    c = run_catalog()
    resolved = c.resolve_call("namespace", ["MCP", "gitHub.createIssue", {"title": "t"}])
    assert resolved.entry.id == "mcp:git-hub:create_issue"
    assert resolved.input == {"title": "t"} and resolved.replay_safe is False and resolved.label == "MCP.gitHub.createIssue"
    assert c.resolve_call("namespace", ["MCP", "gitHub.resources.read", {}]).entry.id == "mcp:git-hub:files"


@pytest.mark.parametrize(
    "args",
    [
        ["MCP", "gitHub.create_issue", {}],
        ["MCP", "github.createIssue", {}],
        ["tools", "gitHub.createIssue", {}],
        ["MCP", "mcp:git-hub:create_issue", {}],
        ["MCP", 7, {}],
        ["MCP", "gitHub.resources.list", {}],
        [],
    ],
)
def test_paths_outside_the_namespace_map_get_p04(args: list[Any]) -> None:
    c = run_catalog()
    with pytest.raises(BridgeReplyError) as info:
        c.resolve_call("namespace", args)
    path = args[1] if len(args) > 1 else ""
    assert info.value.message == f"unknown namespace path: {path}"
    assert info.value.provenance == "internal"


def test_forged_non_object_input_gets_b14_with_input_provenance() -> None:
    c = run_catalog()
    with pytest.raises(BridgeReplyError) as info:
        c.resolve_call("namespace", ["MCP", "gitHub.createIssue", [1]])
    assert info.value.message == "MCP.gitHub.createIssue takes a single object argument."
    assert info.value.provenance == "input"


def test_mcp_entries_are_not_reachable_through_tools_helpers() -> None:
    c = run_catalog()
    with pytest.raises(BridgeReplyError) as info:
        c.resolve_call("callValue", ["mcp:git-hub:create_issue", {}])
    assert info.value.message.startswith("Unknown tool: mcp:git-hub:create_issue.")


def test_runtime_route_sends_namespace_tool_call_and_delivers_the_raw_result() -> None:
    p, outbox = ports()
    c = run_catalog()

    class FakeRun:
        tool_call_id = "call-1"
        run_id = "run_x"
        replay_id = "replay_abc"

    req = PendingRequest(bridge_id="bridge:namespace:1", method=BridgeMethod.NAMESPACE, args=["MCP", "gitHub.createIssue", {"title": "t"}])
    req.call = resolved = c.resolve_call(req.method, req.args)
    req.nested_call_id = "cellblock_call-1_abc_1"
    p.dispatch(FakeRun(), req)  # type: ignore[arg-type]
    call = outbox.get_nowait().tool_call
    assert (call.catalog_id, call.source, call.owner, call.name, call.method) == ("mcp:git-hub:create_issue", 2, "git-hub", "create_issue", pb.NESTED_CALL_METHOD_NAMESPACE)
    assert json.loads(call.input_json) == {"title": "t"}
    raw = {"content": [{"type": "text", "text": "ok"}], "details": {"x": 1}, "isError": False}
    assert c.project_result(req.method, resolved, ToolOutcome(req.nested_call_id, ok_json=json.dumps(raw)), 1 << 20) == raw
    with pytest.raises(BridgeReplyError) as info:
        c.project_result(req.method, resolved, ToolOutcome(req.nested_call_id, error_kind="cancelled"), 1 << 20)
    assert info.value.message == 'Tool "MCP.gitHub.createIssue" was cancelled before it returned.'


def test_guest_catalog_carries_mcp_data_and_files_only_with_mcp_entries() -> None:
    data = run_catalog().guest_catalog()
    assert [f["path"] for f in data["apiFiles"]] == ["mcp/index.d.ts", "mcp/gitHub.d.ts"]
    assert data["mcp"]["servers"][0]["serverName"] == "git-hub"
    assert [t["id"] for t in data["allTools"]] == ["client:client:pick", "host:core:read"]
    plain = run_catalog([{"source": "host", "name": "read"}])
    assert plain.guest_catalog()["mcp"] is None and plain.guest_catalog()["apiFiles"] == []


# ------------------------------------------------------------- configuration
def test_parse_mcp_servers() -> None:
    servers = parse_mcp_servers('{"time": {"command": ["python", "-m", "mcp_server_time"], "env": {"A": "1"}}, " remote ": {"url": "http://127.0.0.1:3001/mcp"}}')
    assert servers == (
        McpServerConfig(name="remote", url="http://127.0.0.1:3001/mcp"),
        McpServerConfig(name="time", command=("python", "-m", "mcp_server_time"), env={"A": "1"}),
    )
    assert parse_mcp_servers("") == () and parse_mcp_servers(None) == ()


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("[]", "must be a JSON object"),
        ('{"a:b": {"url": "http://x"}}', "without ':' or whitespace"),
        ('{"a": {"url": "http://x", "command": ["x"]}}', "exactly one of command or url"),
        ('{"a": {}}', "exactly one of command or url"),
        ('{"a": {"url": "file:///x"}}', "http:// or https://"),
        ('{"a": {"command": []}}', "non-empty list"),
        ('{"a": {"command": ["x"], "env": {"K": 1}}}', "env must map strings to strings"),
        ('{"a": {"command": ["x"], "args": []}}', "unknown field(s): args"),
        ('{"a": {"url": "http://x"}, " a": {"url": "http://y"}}', "unique"),
    ],
)
def test_parse_mcp_servers_refuses_bad_entries(text: str, problem: str) -> None:
    with pytest.raises(ValueError, match=None) as info:
        parse_mcp_servers(text)
    assert problem in str(info.value)


def test_server_settings_read_cellblock_mcp_servers() -> None:
    settings = ServerSettings.from_env({"CELLBLOCK_MCP_SERVERS": '{"m": {"command": ["node", "m.js"]}}'})
    assert settings.mcp_servers == (McpServerConfig(name="m", command=("node", "m.js")),)
    assert ServerSettings.from_env({}).mcp_servers == ()
    with pytest.raises(ValueError):
        ServerSettings.from_env({"CELLBLOCK_MCP_SERVERS": "{not json"})


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_a_runtime_result_with_a_non_json_number_is_not_json(constant: str) -> None:
    c = run_catalog()
    req = PendingRequest(bridge_id="bridge:namespace:1", method=BridgeMethod.NAMESPACE, args=["MCP", "gitHub.createIssue", {"title": "t"}])
    resolved = c.resolve_call(req.method, req.args)
    with pytest.raises(BridgeReplyError) as info:
        c.project_result(req.method, resolved, ToolOutcome("n1", ok_json='{"details": {"x": ' + constant + "}}"), 1 << 20)
    assert info.value.message == 'Tool "MCP.gitHub.createIssue" returned a result that is not valid JSON.'
