"""Tool surface (SPEC §3.3) and the exec/wait definitions and description (SPEC §4)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from cellblock.server.catalog import Catalog, CatalogView, exec_description, tool_surface
from cellblock.server.catalog._surface import CODE_DESC, exec_tool, namespace_section, paragraph_a, paragraph_d, wait_tool
from cellblock.server.config import CodeModeConfig

# Texts copied from SPEC §4.1-§4.3 for byte comparison.
SPEC_CODE_DESC = "Program body (JavaScript or TypeScript, run as an async function; `return` the result). `tools.search` takes a query string, not an object. Copy exact ids from `ALL_TOOLS` or `tools.search`; never put dependent calls in Promise.all. Node built-in modules are not available."  # noqa: E501
SPEC_A = "Runs a JavaScript or TypeScript program in an isolated cell. The program is the body of an async function: top-level `await` works, and `return` sends the final value back (without `return` the value is null). {lang} The source is never a shell command: Node.js modules, `require`/`import` and direct file, network or environment access are NOT available; do shell, file and network work through catalog tools allowed by policy."  # noqa: E501
SPEC_LANG_BOTH = 'Set `language` to "javascript" (default) or "typescript"; TypeScript types are stripped, never checked, and a failed shell-like source must not be resent.'  # noqa: E501
SPEC_LANG_JS = "Only JavaScript is enabled; a failed shell-like source must not be resent."
SPEC_LANG_TS = "Only TypeScript is enabled (types are stripped, never checked); a failed shell-like source must not be resent."  # noqa: E501
SPEC_B = 'Catalog: `ALL_TOOLS` is the complete compact catalog (id, name, description, input and output hints). `tools.search(query: string, options?)` ranks tools by relevance; `tools.describe(id: string)` adds the full schemas; `tools.callValue(id: string, args?)` returns its JSON value directly; `tools.call(id: string, args?)` returns the raw { tool, result } envelope; `tools.<name>(args)` is a shortcut for unambiguous names. Never make up or rewrite a tool id: copy it from the quick index, `ALL_TOOLS` or `tools.search`, e.g. `const hit = ALL_TOOLS.find((t) => t.name === "read") ?? (await tools.search("read file"))[0];`'  # noqa: E501
SPEC_C = "Quick-index arrows are trusted declared output hints: use the declared fields in the first exec instead of spending another exec inspecting results. `-> ?` means the output shape is unknown, so do not guess field names: return the raw value unchanged (`return await tools.callValue(id, args)`) and filter or map it in a later exec. The same holds when the final dependent call after declared-output calls is `-> ?`: return its raw value rather than wrapping it in the requested answer shape."  # noqa: E501
SPEC_D = 'Keep dependent reads, checks and follow-up calls in order inside one exec; parallelize only independent work. Nested calls go through the normal tool policy and approvals. `text(value)`, `json(value)` and `console.log(...)` append output; `yield_control(reason?)` pauses and hands control back; `setTimeout` delays count against the time budget. Each exec or wait call may run {timeout} ms, and the whole run shares {output} bytes of output. When the result status is "waiting", call `wait` with its runId.'  # noqa: E501
SPEC_E = 'MCP tools are reachable only through the `MCP` namespace, not through `tools.*`. Read their TypeScript declarations with `API.list(prefix?)` and `API.read(path)` (start with "mcp/index.d.ts") or `MCP.<server>.$api()`, then call `MCP.<server>.<tool>({ ... })` with one object argument.'  # noqa: E501

CONFIG = CodeModeConfig()
BOTH = SPEC_A.format(lang=SPEC_LANG_BOTH)


def catalog_with(*tools: dict[str, Any]) -> Catalog:
    catalog = Catalog()
    catalog.register(list(tools))
    return catalog


HOST_ONLY = catalog_with({"source": "host", "name": "read", "description": "SECRET-HOST-DESCRIPTION"})
UNTRUSTED = catalog_with(
    {"source": "mcp", "owner": "github", "name": "create_issue", "description": "MCP-SECRET", "parameters": {"title": "MCPSCHEMA"}},
    {"source": "client", "name": "client_secret_name", "description": "CLIENT-SECRET"},
)


def test_fixed_paragraphs_are_byte_exact() -> None:
    assert CODE_DESC == SPEC_CODE_DESC
    assert len(CODE_DESC) < 320
    assert "MCP" not in CODE_DESC and "API" not in CODE_DESC
    assert paragraph_a(CONFIG) == BOTH
    assert paragraph_a(CodeModeConfig(languages=("javascript",))) == SPEC_A.format(lang=SPEC_LANG_JS)
    assert paragraph_a(CodeModeConfig(languages=("typescript",))) == SPEC_A.format(lang=SPEC_LANG_TS)
    assert paragraph_d(CONFIG) == SPEC_D.format(timeout=10000, output=65536)


@pytest.mark.parametrize("languages", [("javascript", "typescript"), ("javascript",), ("typescript",)])
def test_paragraphs_a_to_d_stay_under_2400_characters(languages: tuple[Any, ...]) -> None:
    config = CodeModeConfig(languages=languages, timeout_ms=60000, max_output_bytes=10485760)
    description = exec_description(Catalog().view, config)
    assert description.split("\n\n")[1:3] == [SPEC_B, SPEC_C]
    assert len(description) < 2400


def test_description_without_host_or_mcp_is_paragraphs_a_to_d() -> None:
    config = CodeModeConfig.from_json({"timeoutMs": 2500, "maxOutputBytes": 4096})
    view = catalog_with({"source": "client", "name": "pick"}).view
    assert exec_description(view, config) == "\n\n".join([BOTH, SPEC_B, SPEC_C, SPEC_D.format(timeout=2500, output=4096)])


def test_description_with_mcp_and_host_parts_in_order() -> None:
    view = catalog_with(
        {"source": "host", "name": "read"},
        {"source": "mcp", "owner": "chrome-devtools", "name": "click"},
        {"source": "mcp", "owner": "github", "name": "create_issue"},
    ).view
    parts = exec_description(view, CONFIG).split("\n\n")
    assert parts[4] == SPEC_E
    assert parts[5] == (
        "Namespace globals:\n- MCP: MCP server tools grouped by server. Visible servers: chromeDevtools, github."
    )
    assert parts[6].startswith("Host tool quick index")
    assert parts[7].startswith("Call these ids exactly")
    assert len(parts) == 8


def test_untrusted_metadata_never_appears_in_the_description() -> None:
    description = exec_description(UNTRUSTED.view, CONFIG)
    for secret in ("create_issue", "MCP-SECRET", "MCPSCHEMA", "client_secret_name", "CLIENT-SECRET"):
        assert secret not in description
    assert "Host tool quick index" not in description
    assert "Visible servers: github." in description
    assert "SECRET-HOST-DESCRIPTION" not in exec_description(HOST_ONLY.view, CONFIG)


def test_namespace_section_names_at_most_20_servers() -> None:
    servers = [f"s{i:02d}" for i in range(23)] + ["constructor"]
    view = catalog_with(*({"source": "mcp", "owner": s, "name": "t"} for s in servers)).view
    expected = ", ".join(sorted(["constructor2", *(f"s{i:02d}" for i in range(23))])[:20])
    assert namespace_section(view) == (
        "Namespace globals:\n- MCP: MCP server tools grouped by server. Visible servers: "
        f'{expected}, \u2026 (4 more; see API.list("mcp")).'
    )
    assert namespace_section(HOST_ONLY.view) is None


def test_exec_definition() -> None:
    tool = exec_tool(HOST_ONLY.view, CONFIG)
    assert list(tool) == ["name", "description", "parameters"]
    assert tool["name"] == "exec"
    assert tool["parameters"] == {
        "type": "object",
        "properties": {
            "code": {"type": "string", "description": SPEC_CODE_DESC},
            "command": {
                "type": "string",
                "description": "Alias of `code` for exec-style hooks; must equal `code` when both are set. "
                "Not a shell command.",
            },
            "language": {
                "type": "string",
                "enum": ["javascript", "typescript"],
                "description": 'Must be "javascript" or "typescript" (default "javascript"); never a shell. '
                "TypeScript is type-stripped, not type-checked.",
            },
            "restartSafe": {
                "type": "boolean",
                "description": "Only for read-only work that may be replayed after a service restart: "
                "side-effecting tool calls are then refused before they run. Leave unset for ordinary calls.",
            },
        },
    }


def test_language_enum_follows_enabled_languages() -> None:
    ts = exec_tool(HOST_ONLY.view, CodeModeConfig(languages=("typescript",)))["parameters"]["properties"]["language"]
    assert ts["enum"] == ["typescript"]
    assert ts["description"].startswith('Must be "typescript" (default "typescript"); never a shell.')
    swapped = CodeModeConfig(languages=("typescript", "javascript"))
    assert exec_tool(HOST_ONLY.view, swapped)["parameters"]["properties"]["language"]["enum"] == [
        "javascript",
        "typescript",
    ]


def test_wait_definition() -> None:
    assert json.dumps(wait_tool()) == json.dumps(
        {
            "name": "wait",
            "description": 'Resumes a code-mode run whose exec (or an earlier wait) returned status "waiting". '
            "Returns the same result shape as exec: completed, waiting again, or failed.",
            "parameters": {
                "type": "object",
                "required": ["runId"],
                "properties": {"runId": {"type": "string", "description": "The runId from the waiting result."}},
            },
        }
    )


@pytest.mark.parametrize(
    ("config", "model", "engaged"),
    [
        (CONFIG, "anthropic/claude-opus-5", True),
        (CONFIG, "ANTHROPIC/Claude-Opus-5", True),
        (CONFIG, "claude-opus-5", True),
        (CONFIG, "bedrock/us.anthropic/claude-opus-5", True),
        (CONFIG, "minimax/minimax-m3", True),
        (CONFIG, "openai/gpt-4o", False),
        (CONFIG, None, False),
        (CONFIG, "", False),
        (CodeModeConfig.from_json(True), None, True),
        (CodeModeConfig.from_json(True), "openai/gpt-4o", True),
        (CodeModeConfig.from_json(False), "anthropic/claude-opus-5", False),
        (CodeModeConfig.from_json({"modelTiers": {"my/model": "preferred"}}), "other/model", True),
        (CodeModeConfig.from_json({"modelTiers": {"my/model": "preferred"}}), "anthropic/claude-opus-5", False),
        (CodeModeConfig.from_json({"modelTiers": {"x/m": "capable", "y/m": "preferred"}}), "x/m", False),
        (CodeModeConfig.from_json({"modelTiers": {"x/m": "capable", "y/m": "preferred"}}), "z/m", True),
        (CodeModeConfig.from_json({"modelTiers": {"x/m": "Preferred"}}), "x/m", False),
    ],
)
def test_engagement(config: CodeModeConfig, model: str | None, engaged: bool) -> None:
    result, tools = tool_surface(HOST_ONLY, config, model)
    assert result is engaged
    names = [tool["name"] for tool in tools]
    assert names == (["exec", "wait"] if engaged else ["read"])


def test_empty_catalog_never_engages() -> None:
    everyone = CodeModeConfig.from_json(True)
    assert tool_surface(Catalog(), everyone, "anthropic/claude-opus-5") == (False, [])
    denied = Catalog()
    denied.register([{"source": "host", "name": "x"}], deny=["x"])
    assert tool_surface(denied, everyone, None) == (False, [{"source": "host", "name": "x"}])
    assert tool_surface(None, everyone, None) == (False, [])


def test_engaged_surface_lists_direct_tools_and_not_engaged_lists_registered_tools_unchanged() -> None:
    tools: list[dict[str, Any]] = [
        {"source": "host", "name": "read", "parameters": {"type": "object"}, "extra": [1]},
        {"source": "host", "name": "notify", "directOnly": True},
        {"source": "host", "name": "exec", "directOnly": True},
        {"source": "mcp", "owner": "gh", "name": "issue"},
    ]
    catalog = Catalog()
    catalog.register(tools, direct_tool_names=["read", "issue"])
    engaged, surface = tool_surface(catalog, CodeModeConfig.from_json(True))
    assert engaged
    assert [tool["name"] for tool in surface] == ["exec", "wait", "notify", "read"]
    assert surface[3] == tools[0]
    assert "host:core:exec" in surface[0]["description"]
    not_engaged, plain = tool_surface(catalog, CodeModeConfig.from_json(False))
    assert not not_engaged and plain == tools


def test_surface_is_deterministic() -> None:
    def build() -> CatalogView:
        return catalog_with(*({"source": "host", "name": f"t{i}", "outputSchema": {"type": "string"}} for i in range(30))).view

    first = json.dumps(tool_surface(build(), CodeModeConfig.from_json(True)), ensure_ascii=False)
    second = json.dumps(tool_surface(build(), CodeModeConfig.from_json(True)), ensure_ascii=False)
    assert first == second
