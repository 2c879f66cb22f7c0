"""MCP namespace map, ``API`` files and ``$api`` data (SPEC §8.5–8.7), driven by tables."""

from __future__ import annotations

import json
from typing import Any

import pytest

from cellblock.server.catalog import Catalog
from cellblock.server.catalog._declarations import (
    ROOT_NOTE,
    declaration_type,
    render_index,
    render_server,
    server_note,
    tool_parameters,
)
from cellblock.server.catalog._namespace import build_namespace


def mcp(owner: str, name: str, **extra: Any) -> dict[str, Any]:
    return {"source": "mcp", "owner": owner, "name": name, **extra}


def namespace(*tools: dict[str, Any]) -> Any:
    return build_namespace(Catalog().register(list(tools)).entries)


# ------------------------------------------------------------- declaration types
DECLARATION_TYPES: list[tuple[Any, str]] = [
    ({"type": "string"}, "string"),
    ({"type": "integer"}, "number"),
    ({"type": "number"}, "number"),
    ({"type": "boolean"}, "boolean"),
    ({"type": "null"}, "null"),
    ({"type": ["string", "null"]}, "string | null"),
    ({"type": "array", "items": {"type": "string"}}, "Array<string>"),
    ({"type": "array"}, "Array<unknown>"),
    ({"type": "object"}, "Record<string, unknown>"),
    ({"type": "object", "properties": {}}, "Record<string, unknown>"),
    ({"type": "object", "required": ["id"], "properties": {"id": {"type": "string"}, "n": {"type": "integer"}}}, "{ id: string; n?: number }"),
    ({"type": "object", "properties": {"a-b": {"type": "string"}, "$ok_1": {"type": "boolean"}}}, '{ "a-b"?: string; $ok_1?: boolean }'),
    ({"enum": ["a", "b", 1, None, True]}, '"a" | "b" | 1 | null | true'),
    ({"type": "string", "enum": ["x"]}, '"x"'),
    ({"enum": [str(i) for i in range(17)], "type": "string"}, "string"),
    ({"enum": [{"a": 1}]}, "unknown"),
    ({"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "number"}}]}, "string | Array<number>"),
    ({"anyOf": [{"type": "string"}] * 9}, "unknown"),
    ({"anyOf": [{"type": "string"}] * 8}, " | ".join(["string"] * 8)),
    ({"properties": {"a": {"type": "string"}}}, "unknown"),
    ({}, "unknown"),
    (True, "unknown"),
    ("string", "unknown"),
    ({"type": "bogus"}, "unknown"),
]


@pytest.mark.parametrize(("schema", "expected"), DECLARATION_TYPES)
def test_declaration_types(schema: Any, expected: str) -> None:
    assert declaration_type(schema) == expected


def test_nesting_deeper_than_eight_levels_is_unknown() -> None:
    schema: Any = {"type": "string"}
    for _ in range(9):
        schema = {"type": "array", "items": schema}
    # Level 0 is the outer array; the string sits at level 9, deeper than 8.
    assert declaration_type(schema) == "Array<" * 9 + "unknown" + ">" * 9
    assert declaration_type(schema["items"]) == "Array<" * 8 + "string" + ">" * 8


# ------------------------------------------------------------- parameters
def test_parameters_required_first_in_required_order_then_declaration_order() -> None:
    schema = {
        "type": "object",
        "required": ["c", "a", "zz"],
        "properties": {"a": {"type": "string", "description": "  first\n line "}, "b": {"type": "integer", "default": 3}, "c": {"type": "boolean"}},
    }
    params = tool_parameters(schema)
    assert [(p.name, p.required, p.type) for p in params] == [("c", True, "boolean"), ("a", True, "string"), ("b", False, "number")]
    assert params[1].description == "first line"
    assert params[2].has_default and params[2].default == 3


@pytest.mark.parametrize("schema", [None, {}, {"type": "object"}, {"properties": []}, "x"])
def test_no_parameters(schema: Any) -> None:
    assert tool_parameters(schema) == []


# ------------------------------------------------------------- identifiers and the map
IDENTIFIER_TABLE: list[tuple[list[dict[str, Any]], dict[str, str]]] = [
    ([mcp("github", "create_issue")], {"github.createIssue": "mcp:github:create_issue"}),
    ([mcp("chrome-devtools", "take-screenshot")], {"chromeDevtools.takeScreenshot": "mcp:chrome-devtools:take-screenshot"}),
    ([mcp("constructor", "prototype")], {"constructor2.prototype2": "mcp:constructor:prototype"}),
    ([mcp("s", "delete"), mcp("s", "class")], {"s.class2": "mcp:s:class", "s.delete2": "mcp:s:delete"}),
    ([mcp("s", "a_b"), mcp("s", "a-b")], {"s.aB": "mcp:s:a-b", "s.aB2": "mcp:s:a_b"}),
    ([mcp("tools", "x"), mcp("namespaces", "y"), mcp("MCP", "z")], {"namespaces2.y": "mcp:namespaces:y", "tools2.x": "mcp:tools:x", "mCP.z": "mcp:MCP:z"}),
    ([mcp("s", "resources"), mcp("s", "$api"), mcp("s", "123")], {"s.tool": "mcp:s:123", "s.api": "mcp:s:$api", "s.resources2": "mcp:s:resources"}),
    ([mcp("s", "toString"), mcp("s", "__proto__")], {"s.toString": "mcp:s:toString", "s.proto": "mcp:s:__proto__"}),
    (
        [mcp("s", "b", operation="resources.read"), mcp("s", "a", operation="resources.read"), mcp("s", "p", operation="prompts.get")],
        {"s.resources.read": "mcp:s:a", "s.prompts.get": "mcp:s:p"},
    ),
]


@pytest.mark.parametrize(("tools", "paths"), IDENTIFIER_TABLE)
def test_namespace_map(tools: list[dict[str, Any]], paths: dict[str, str]) -> None:
    assert namespace(*tools).paths == paths


def test_only_mcp_entries_and_no_files_without_them() -> None:
    ns = namespace({"source": "host", "name": "read"}, {"source": "client", "name": "pick"})
    assert ns.paths == {} and ns.api_files() == [] and ns.guest_data() == (None, [])


# ------------------------------------------------------------- files
SERVER_PRELUDE = """type McpApiHeader = { header: string; tools?: unknown[]; schemas?: Record<string, unknown> };

type McpToolResult = {
  content?: unknown[];
  structuredContent?: unknown;
  isError?: boolean;
  [key: string]: unknown;
};

"""
API_LINES = """  /** Returns this declaration header; pass a tool name and { schema: true } for its JSON Schema. */
  function $api(toolName?: string, options?: { schema?: boolean }): Promise<McpApiHeader>;
"""

SERVER_FILES: list[tuple[list[dict[str, Any]], str]] = [
    (
        [mcp("gh", "ping")],
        "declare namespace MCP.gh {\n" + API_LINES + "\n  function ping(input?: Record<string, never>): Promise<McpToolResult>;\n}\n",
    ),
    (
        [mcp("gh", "create_issue", description="Creates an issue.\n\n  Closes */ nothing.  ", parameters={
            "type": "object", "required": ["title"],
            "properties": {"body": {"type": "string", "description": "Body\ntext"}, "title": {"type": "string", "description": "Title"},
                           "n": {"type": "integer", "default": 3}, "x-y": {"enum": ["a", "b"], "description": "Mode", "default": "a"}}})],
        "declare namespace MCP.gh {\n" + API_LINES + "\n"
        "  /**\n"
        "   * Creates an issue.\n"
        "   * Closes * / nothing.\n"
        "   *\n"
        "   * @param title Title\n"
        "   * @param body? Body text\n"
        "   * @param x-y? Mode\n"
        "   */\n"
        "  function createIssue(input: {\n"
        "    /** Title */\n"
        "    title: string;\n"
        "    /** Body text */\n"
        "    body?: string;\n"
        "    /** Default: 3. */\n"
        "    n?: number;\n"
        '    /** Mode Default: "a". */\n'
        '    "x-y"?: "a" | "b";\n'
        "  }): Promise<McpToolResult>;\n"
        "}\n",
    ),
    (
        [mcp("gh", "search", parameters={"type": "object", "properties": {"q": {"type": "string"}}}),
         mcp("gh", "read", operation="resources.read", parameters={"type": "object", "required": ["uri"], "properties": {"uri": {"type": "string"}}}),
         mcp("gh", "list", operation="resources.list"),
         mcp("gh", "get", operation="prompts.get", description="Gets a prompt.")],
        "declare namespace MCP.gh {\n" + API_LINES + "\n"
        "  function search(input?: {\n"
        "    q?: string;\n"
        "  }): Promise<McpToolResult>;\n"
        "\n"
        "  namespace prompts {\n"
        "    /**\n"
        "     * Gets a prompt.\n"
        "     */\n"
        "    function get(input?: Record<string, never>): Promise<McpToolResult>;\n"
        "  }\n"
        "\n"
        "  namespace resources {\n"
        "    function list(input?: Record<string, never>): Promise<McpToolResult>;\n"
        "\n"
        "    function read(input: {\n"
        "      uri: string;\n"
        "    }): Promise<McpToolResult>;\n"
        "  }\n"
        "}\n",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("tools", "body"), SERVER_FILES)
def test_server_file(tools: list[dict[str, Any]], body: str) -> None:
    files = namespace(*tools).api_files()
    assert [f["path"] for f in files] == ["mcp/index.d.ts", "mcp/gh.d.ts"]
    server = files[1]
    assert server["content"] == SERVER_PRELUDE + body
    assert server["description"] == "MCP server declaration for gh."
    assert server["bytes"] == len(server["content"].encode("utf-8"))


def test_description_is_cut_to_twelve_lines_and_tools_are_in_method_order() -> None:
    text = "\n".join(f"line {i}" for i in range(20))
    content = namespace(mcp("s", "zeta"), mcp("s", "alpha", description=text)).api_files()[1]["content"]
    assert content.index("function alpha") < content.index("function zeta")
    assert "line 11" in content and "line 12" not in content


def test_index_file_and_identifier_order() -> None:
    files = namespace(mcp("zeta-server", "a"), mcp("alpha", "b"), mcp("Beta", "c")).api_files()
    assert [f["path"] for f in files] == ["mcp/index.d.ts", "mcp/alpha.d.ts", "mcp/beta.d.ts", "mcp/zetaServer.d.ts"]
    assert files[0]["description"] == "Root MCP namespace declaration and list of servers."
    assert files[0]["content"] == (
        '/// <reference path="./alpha.d.ts" />\n'
        '/// <reference path="./beta.d.ts" />\n'
        '/// <reference path="./zetaServer.d.ts" />\n'
        "\n"
        "type McpApiHeader = { header: string; servers?: unknown[] };\n"
        "\n"
        "declare const MCP: {\n"
        "  /** Lists the visible MCP servers; read mcp/<server>.d.ts for their tools. */\n"
        "  $api(): Promise<McpApiHeader>;\n"
        "  readonly alpha: typeof MCP.alpha;\n"
        "  readonly beta: typeof MCP.beta;\n"
        "  readonly zetaServer: typeof MCP.zetaServer;\n"
        "};\n"
    )
    assert render_index(["alpha", "beta", "zetaServer"]) == files[0]["content"]


def test_bytes_are_utf8_lengths() -> None:
    files = namespace(mcp("s", "t", description="Grüße ✓")).api_files()
    assert files[1]["bytes"] == len(files[1]["content"].encode("utf-8")) > len(files[1]["content"])


# ------------------------------------------------------------- guest data
def _join(data: dict[str, Any], template: list[int]) -> str:
    return "".join(data["texts"][i] for i in template)


def test_guest_data_for_api_and_calls() -> None:
    schema = {"type": "object", "required": ["b", "a"], "properties": {"a": {"type": "string"}, "b": {"type": "integer"}, "c": {"type": "boolean", "default": False}}}
    ns = namespace(mcp("srv", "do_it", description="Does it.", parameters=schema), mcp("srv", "doIt"), mcp("srv", "r", operation="resources.read"))
    data, files = ns.guest_data()
    assert data is not None
    assert [{**f, "content": _join(data, f["content"])} for f in files] == ns.api_files()
    root = data["root"]
    assert json.loads(root["servers"]) == [{"identifier": "srv", "serverName": "srv", "toolCount": 3}]
    assert root["note"] == ROOT_NOTE and _join(data, root["header"]) == ns.api_files()[0]["content"]
    (server,) = data["servers"]
    assert server["note"] == server_note("srv") == "Call MCP.srv.<tool>({ ... }) with one object argument; pass { schema: true } to include JSON Schemas."
    assert _join(data, server["header"]) == ns.api_files()[1]["content"]
    # `doIt` is taken by mcp:srv:doIt (id order), so do_it becomes doIt2.
    assert [(t["method"], t["path"], t["mcpTool"], t["operation"], t["bridgePath"]) for t in server["tools"]] == [
        ("doIt", "MCP.srv.doIt", "doIt", "tool", "srv.doIt"),
        ("doIt2", "MCP.srv.doIt2", "do_it", "tool", "srv.doIt2"),
        ("resources.read", "MCP.srv.resources.read", "r", "resources.read", "srv.resources.read"),
    ]
    do_it = server["tools"][1]
    assert do_it["required"] == ["b", "a"] and do_it["defaults"] == [["c", "false"]] and json.loads(do_it["parameters"]) == schema
    # Selectors: a method, a path or an MCP tool name -> [tool indexes, header template].
    assert server["selectors"]["do_it"][0] == [1]
    assert server["selectors"]["MCP.srv.resources.read"][0] == [2]
    assert server["selectors"]["doIt"][0] == [0]
    single = _join(data, server["selectors"]["doIt2"][1])
    assert single == render_server("srv", [ns.servers[0].tools[1]])
    assert "function doIt2(" in single and "function doIt(" not in single


def test_guest_data_sends_each_declaration_block_once() -> None:
    # Every header is a template over distinct pieces: a tool's block serves the server file and
    # each of its selectors (method, path, MCP tool name), and equals what render_server writes.
    tools = [mcp("s", f"tool_{i}", description=f"Tool {i}.", parameters={"type": "object", "properties": {"q": {"type": "string", "description": f"Query {i}."}}}) for i in range(30)]
    ns = namespace(*tools, mcp("s", "r", operation="resources.read"), mcp("s", "g", operation="prompts.get"))
    data, _files = ns.guest_data()
    assert data is not None
    (server,) = data["servers"]
    assert len(data["texts"]) == len(set(data["texts"]))
    for text, (chosen, template) in server["selectors"].items():
        assert _join(data, template) == render_server("s", [ns.servers[0].tools[i] for i in chosen]), text
    for i in range(30):
        assert sum(f"function tool{i}(" in t for t in data["texts"]) == 1
    rendered = sum(len(_join(data, t)) for _c, t in server["selectors"].values()) + 2 * len(_join(data, server["header"]))
    assert sum(map(len, data["texts"])) * 3 < rendered


def test_selector_matching_two_tools_selects_both() -> None:
    # In id order "foo" -> foo, "foo-" -> foo2, "foo2" -> foo22: selector "foo2" is one tool's
    # method and the other's MCP tool name.
    ns = namespace(mcp("s", "foo"), mcp("s", "foo-"), mcp("s", "foo2"))
    data, _files = ns.guest_data()
    assert data is not None
    server = data["servers"][0]
    assert [t["method"] for t in server["tools"]] == ["foo", "foo2", "foo22"]
    assert server["selectors"]["foo2"][0] == [1, 2]
    header = _join(data, server["selectors"]["foo2"][1])
    assert "function foo2(" in header and "function foo22(" in header and "function foo(" not in header
