"""The guest's ``MCP`` namespace, ``API`` files and ``$api()`` (SPEC §8.5–8.7) in an in-process VM.

The cell's data comes from the real host code (catalog registration, then
:class:`~cellblock.server.api._catalogs.RunCatalog`), so these tests also pin the
host/guest data contract.
"""

from __future__ import annotations

import json
import time
from typing import Any

from cellblock.guest._vm import CellVM
from cellblock.server.api._catalogs import RunCatalog
from cellblock.server.catalog import Catalog, McpNamespace, build_namespace
from cellblock.server.config import CodeModeConfig
from tests.support.outbox import take_items

LIMITS = {"maxPendingToolCalls": 4, "replyInboxBytes": 1 << 20, "maxOutputBytes": 4096, "outputSpentBytes": 0, "outputClosed": False}

TOOLS: list[dict[str, Any]] = [
    {"source": "host", "name": "read"},
    {
        "source": "mcp",
        "owner": "memory",
        "name": "create_entities",
        "description": "Create entities.",
        "parameters": {
            "type": "object",
            "required": ["entities"],
            "properties": {"entities": {"type": "array", "items": {"type": "object"}}, "mode": {"type": "string", "default": "strict"}},
        },
    },
    {"source": "mcp", "owner": "memory", "name": "read_graph", "parameters": {"type": "object", "properties": {}}},
    {"source": "mcp", "owner": "memory", "name": "toString"},
    {"source": "mcp", "owner": "memory", "name": "r", "operation": "resources.read", "parameters": {"type": "object", "required": ["uri"], "properties": {"uri": {"type": "string"}}}},
    {"source": "mcp", "owner": "chrome-devtools", "name": "class"},
]


def guest_catalog(tools: list[dict[str, Any]]) -> dict[str, Any]:
    catalog = Catalog()
    catalog.register(tools)
    return RunCatalog(catalog.view, CodeModeConfig.from_json({})).guest_catalog()


def _namespace(tools: list[dict[str, Any]]) -> McpNamespace:
    catalog = Catalog()
    catalog.register(tools)
    return build_namespace(catalog.view.entries)


def run(source: str, tools: list[dict[str, Any]] = TOOLS, answer: Any = None) -> tuple[dict[str, Any], list[tuple[Any, ...]]]:
    """Runs ``source``; answers each sent request with ``answer(method, args)``."""
    vm = CellVM(memory_limit_bytes=32 << 20, deadline=time.monotonic() + 5.0)
    vm.install({"limits": dict(LIMITS), "catalog": guest_catalog(tools), "bridgeCounters": {}, "nextTimerId": 1})
    vm.start(source)
    sent: list[tuple[Any, ...]] = []
    for _ in range(50):
        items = take_items(vm)
        sent.extend(items)
        requests = [i for i in items if i[0] == "request" and not i[4]]
        if not requests:
            return vm.status(), sent
        for _, bridge_id, method, args_json, _refusal in requests:
            ok, payload = answer(method, json.loads(args_json)) if answer else (True, {"content": [], "isError": False})
            vm.settle(bridge_id, ok, json.dumps(payload) if ok else payload, "")
    raise AssertionError("did not settle")


def value(status: dict[str, Any]) -> Any:
    assert status["phase"] == "fulfilled", status
    return json.loads(status["valueJson"])


def requests(sent: list[tuple[Any, ...]]) -> list[tuple[str, str, Any, str]]:
    return [(i[1], i[2], json.loads(i[3]) if i[3] else None, i[4]) for i in sent if i[0] == "request"]


def test_namespace_shape_is_null_prototype_frozen_and_in_namespaces() -> None:
    status, _ = run(
        """
        return {
          keys: Object.keys(MCP), memory: Object.keys(MCP.memory), proto: Object.getPrototypeOf(MCP) === null,
          frozen: Object.isFrozen(MCP) && Object.isFrozen(MCP.memory) && Object.isFrozen(MCP.memory.resources),
          same: namespaces.MCP === MCP, toStr: typeof MCP.memory.toString, api: typeof MCP.$api,
          resources: Object.keys(MCP.memory.resources), cls: typeof MCP.chromeDevtools.class2,
          desc: Object.getOwnPropertyDescriptor(globalThis, "MCP").writable,
        };
        """
    )
    assert value(status) == {
        "keys": ["chromeDevtools", "memory"],
        "memory": ["createEntities", "readGraph", "toString", "resources"],
        "proto": True,
        "frozen": True,
        "same": True,
        "toStr": "function",
        "api": "function",
        "resources": ["read"],
        "cls": "function",
        "desc": False,
    }


def test_mcp_absent_without_mcp_entries() -> None:
    status, _ = run('return [typeof MCP, Object.keys(namespaces).length, (await API.list()).files.length]', tools=[{"source": "host", "name": "read"}])
    assert value(status) == ["undefined", 0, 0]


def test_call_fills_defaults_and_sends_namespace_request_with_raw_result() -> None:
    result = {"content": [{"type": "text", "text": "ok"}], "structuredContent": {"n": 1}, "isError": False, "details": {"no": 1}}
    status, sent = run(
        "const r = await MCP.memory.createEntities({ entities: [{ name: 'a' }], __proto__x: 1 }); r.content.push(1); return r;",
        answer=lambda m, a: (True, result),
    )
    assert value(status) == {**result, "content": [{"type": "text", "text": "ok"}, 1]}
    assert requests(sent) == [("bridge:namespace:1", "namespace", ["MCP", "memory.createEntities", {"entities": [{"name": "a"}], "__proto__x": 1, "mode": "strict"}], "")]


def test_no_argument_means_empty_object_and_proto_key_stays_data() -> None:
    status, sent = run('await MCP.memory.readGraph(); await MCP.memory.readGraph(JSON.parse(\'{"__proto__": {"x": 1}}\')); return 1')
    assert value(status) == 1
    assert [r[2] for r in requests(sent)] == [["MCP", "memory.readGraph", {}], ["MCP", "memory.readGraph", {"__proto__": {"x": 1}}]]


def test_b14_and_b15_are_refused_with_refusal_reports() -> None:
    status, sent = run(
        """
        const out = [];
        for (const f of [() => MCP.memory.readGraph({}, {}), () => MCP.memory.readGraph([1]), () => MCP.memory.readGraph("x"),
                         () => MCP.memory.readGraph(null), () => MCP.memory.createEntities({}), () => MCP.memory.resources.read({ uri: "u" })]) {
          try { await f(); out.push("ok"); } catch (e) { out.push(e.message); }
        }
        return out;
        """
    )
    assert value(status) == [
        "MCP.memory.readGraph takes a single object argument.",
        "MCP.memory.readGraph takes a single object argument.",
        "MCP.memory.readGraph takes a single object argument.",
        "MCP.memory.readGraph takes a single object argument.",
        "MCP.memory.createEntities is missing required argument(s): entities.",
        "ok",
    ]
    sent_requests = requests(sent)
    assert [(r[0], r[3]) for r in sent_requests[:5]] == [(f"bridge:namespace:{n}", "namespace_arguments") for n in range(1, 6)]
    assert sent_requests[5][:3] == ("bridge:namespace:6", "namespace", ["MCP", "memory.resources.read", {"uri": "u"}])


def test_uncaught_b15_carries_bridge_provenance() -> None:
    status, _ = run("await MCP.memory.createEntities({ mode: 'x' });")
    assert status["failureKind"] == "bridge"
    assert status["failureBridgeId"] == "bridge:namespace:1"
    assert json.loads(status["failureMessage"]).splitlines()[0] == "Error: MCP.memory.createEntities is missing required argument(s): entities."


def test_api_files_list_and_read() -> None:
    status, sent = run(
        """
        const all = await API.list();
        const mem = await API.list("mcp/memory.d.ts");
        const f = await API.read("/mcp/memory.d.ts");
        let bad, unknown;
        try { await API.read("mcp/../x"); } catch (e) { bad = e.message; }
        try { await API.read("mcp/nope.d.ts"); } catch (e) { unknown = e.message; }
        return { all: all.files.map((x) => x.path), mem: mem.files.length, frozen: Object.isFrozen(f), has: f.content.includes("function createEntities(input: {"), bad, unknown };
        """
    )
    assert value(status) == {
        "all": ["mcp/index.d.ts", "mcp/chromeDevtools.d.ts", "mcp/memory.d.ts"],
        "mem": 1,
        "frozen": True,
        "has": True,
        "bad": 'API file path is invalid: "mcp/../x".',
        "unknown": 'Unknown API file: "mcp/nope.d.ts". Call API.list() to see the available files.',
    }
    assert requests(sent) == []


def test_api_helpers_answer_in_the_guest() -> None:
    files = {f["path"]: f["content"] for f in _namespace(TOOLS).api_files()}
    status, sent = run(
        """
        const root = await MCP.$api();
        const all = await MCP.memory.$api();
        const one = await MCP.memory.$api("create_entities", { schema: true });
        const byPath = await MCP.memory.$api("MCP.memory.resources.read");
        let miss;
        try { await MCP.memory.$api("nope"); } catch (e) { miss = e.message; }
        return { root, all, one, byPath: [byPath.scope, byPath.tools[0].method], miss };
        """
    )
    got = value(status)
    assert requests(sent) == []
    assert got["root"] == {
        "kind": "mcp_api",
        "scope": "root",
        "header": files["mcp/index.d.ts"],
        "servers": [{"identifier": "chromeDevtools", "serverName": "chrome-devtools", "toolCount": 1}, {"identifier": "memory", "serverName": "memory", "toolCount": 4}],
        "note": 'Read "mcp/<server>.d.ts" with API.read, or call MCP.<server>.$api(toolName, { schema: true }) for one tool\'s JSON Schema.',
    }
    assert list(got["all"]) == ["kind", "scope", "server", "header", "tools", "note"]
    assert got["all"]["scope"] == "server" and got["all"]["header"] == files["mcp/memory.d.ts"]
    assert got["all"]["server"] == {"identifier": "memory", "serverName": "memory"}
    assert [t["method"] for t in got["all"]["tools"]] == ["createEntities", "resources.read", "readGraph", "toString"]
    one = got["one"]
    assert list(one) == ["kind", "scope", "server", "header", "tools", "schemas", "note"]
    assert one["scope"] == "tool" and one["tools"] == [
        {"method": "createEntities", "path": "MCP.memory.createEntities", "mcpTool": "create_entities", "operation": "tool", "description": "Create entities."}
    ]
    assert one["schemas"] == {"createEntities": TOOLS[1]["parameters"]}
    assert "function createEntities(" in one["header"] and "readGraph" not in one["header"]
    assert one["note"] == "Call MCP.memory.<tool>({ ... }) with one object argument; pass { schema: true } to include JSON Schemas."
    assert got["byPath"] == ["tool", "resources.read"]
    assert got["miss"] == 'MCP.memory has no tool matching "nope"; call MCP.memory.$api() to list its tools.'


def test_host_data_copies_ignore_a_guest_to_json_on_the_prototypes() -> None:
    # Schemas, defaults and the server list are copied from JSON made before user code ran (SPEC §8.1 item 5).
    status, sent = run(
        'Object.prototype.toJSON = Array.prototype.toJSON = function () { return "tampered"; };'
        ' const one = await MCP.memory.$api("create_entities", { schema: true }); const root = await MCP.$api();'
        " await MCP.memory.createEntities({ entities: [] });"
        " delete Object.prototype.toJSON; delete Array.prototype.toJSON;"
        " return { schema: one.schemas.createEntities, servers: root.servers.length };",
        answer=lambda method, args: (True, {"ok": True}),
    )
    assert status["phase"] == "fulfilled", status
    assert json.loads(status["valueJson"]) == {"schema": TOOLS[1]["parameters"], "servers": 2}
    request = [i for i in sent if i[0] == "request"][0]
    assert json.loads(request[3])[2]["mode"] == "strict", "the default is the host's value, not the guest's toJSON"
