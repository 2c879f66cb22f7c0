"""The tool catalog of a scope and the model-facing tool surface (SPEC §3.2, §3.3, §4, §7).

Typical use::

    catalog = Catalog()
    view = catalog.register(tools, mode="replace", allow=None, deny=None)
    engaged, surface = tool_surface(catalog, config, model_id)
    view.search("read file", {"limit": 5}, config=config)   # tools.search
    entry = view.resolve("host:core:read", "tools.callValue")
    check_input_contract(entry, {"path": "a.txt"})
"""

from ._catalog import Catalog, CatalogCounters, CatalogView, CounterSnapshot
from ._contracts import check_input_contract, check_output_contract, compile_schema
from ._convenience import (
    RESERVED_CONVENIENCE_NAMES,
    convenience_names,
    normalise_tool_name,
)
from ._entries import MCP_OPERATIONS, SOURCES, CatalogEntry, McpOperation, Source
from ._errors import BridgeReplyError, CatalogRegistrationError, Provenance
from ._hints import (
    INPUT_LIMITS,
    OUTPUT_LIMITS,
    Hint,
    HintLimits,
    input_hint,
    output_hint,
    render_hint,
)
from ._identifiers import (
    JS_RESERVED_WORDS,
    SERVER_RESERVED,
    TOOL_RESERVED,
    assign_identifiers,
    server_identifiers,
    to_identifier,
)
from ._lookup import GuestLookup, Helper
from ._quick_index import QUICK_INDEX_HEADING, quick_index, quick_index_lines
from ._registration import CONTROL_TOOL_NAMES, Mode, RegisteredTool, parse_tools
from ._search import SearchIndex, document_tokens, search_limit, tokenize
from ._surface import (
    CODE_DESC,
    COMMAND_DESC,
    PARAGRAPH_B,
    PARAGRAPH_C,
    PARAGRAPH_E,
    RESTART_DESC,
    WAIT_DESCRIPTION,
    exec_description,
    exec_tool,
    namespace_section,
    paragraph_a,
    paragraph_d,
    tool_surface,
    wait_tool,
)
from ._text import compact_json, cut_echo, js_trim

__all__ = [
    "CODE_DESC",
    "COMMAND_DESC",
    "CONTROL_TOOL_NAMES",
    "INPUT_LIMITS",
    "JS_RESERVED_WORDS",
    "MCP_OPERATIONS",
    "OUTPUT_LIMITS",
    "PARAGRAPH_B",
    "PARAGRAPH_C",
    "PARAGRAPH_E",
    "QUICK_INDEX_HEADING",
    "RESERVED_CONVENIENCE_NAMES",
    "RESTART_DESC",
    "SERVER_RESERVED",
    "SOURCES",
    "TOOL_RESERVED",
    "WAIT_DESCRIPTION",
    "BridgeReplyError",
    "Catalog",
    "CatalogCounters",
    "CatalogEntry",
    "CatalogRegistrationError",
    "CatalogView",
    "CounterSnapshot",
    "GuestLookup",
    "Helper",
    "Hint",
    "HintLimits",
    "McpOperation",
    "Mode",
    "Provenance",
    "RegisteredTool",
    "SearchIndex",
    "Source",
    "assign_identifiers",
    "check_input_contract",
    "check_output_contract",
    "compact_json",
    "compile_schema",
    "convenience_names",
    "cut_echo",
    "document_tokens",
    "exec_description",
    "exec_tool",
    "input_hint",
    "js_trim",
    "namespace_section",
    "normalise_tool_name",
    "output_hint",
    "paragraph_a",
    "paragraph_d",
    "parse_tools",
    "quick_index",
    "quick_index_lines",
    "render_hint",
    "search_limit",
    "server_identifiers",
    "to_identifier",
    "tokenize",
    "tool_surface",
    "wait_tool",
]
