"""The pinned public surface of cellblock.server.catalog."""

from __future__ import annotations

import cellblock.server.catalog as catalog

EXPECTED = {
    "BridgeReplyError", "Catalog", "CatalogCounters", "CatalogEntry", "CatalogRegistrationError", "CatalogView",
    "CounterSnapshot", "GuestLookup", "Helper", "Hint", "HintLimits", "McpOperation", "Mode", "Provenance",
    "RegisteredTool", "SearchIndex", "Source",
    "CODE_DESC", "COMMAND_DESC", "CONTROL_TOOL_NAMES", "INPUT_LIMITS", "JS_RESERVED_WORDS", "MCP_OPERATIONS",
    "OUTPUT_LIMITS", "PARAGRAPH_B", "PARAGRAPH_C", "PARAGRAPH_E", "QUICK_INDEX_HEADING",
    "RESERVED_CONVENIENCE_NAMES", "RESTART_DESC", "SERVER_RESERVED", "SOURCES", "TOOL_RESERVED", "WAIT_DESCRIPTION",
    "assign_identifiers", "check_input_contract", "check_output_contract", "compact_json", "compile_schema",
    "convenience_names", "cut_echo", "document_tokens", "exec_description", "exec_tool", "input_hint", "js_trim",
    "namespace_section", "normalise_tool_name", "output_hint", "paragraph_a", "paragraph_d", "parse_tools",
    "quick_index", "quick_index_lines", "render_hint", "search_limit", "server_identifiers", "to_identifier",
    "tokenize", "tool_surface", "wait_tool",
}  # fmt: skip


def test_exported_names() -> None:
    assert set(catalog.__all__) == EXPECTED
    for name in catalog.__all__:
        assert getattr(catalog, name) is not None
