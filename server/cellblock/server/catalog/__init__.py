"""The tool catalog of a scope and the model-facing tool surface (SPEC §3.2, §3.3, §4, §7).

Typical use::

    catalog = Catalog()
    view = catalog.register(tools, mode="replace", allow=None, deny=None)
    engaged, surface = tool_surface(catalog, config, model_id)
    view.search("read file", {"limit": 5}, config=config)   # tools.search
    entry = view.resolve("host:core:read", "tools.callValue")
    check_input_contract(entry, {"path": "a.txt"})

Modules by role: ``_registration`` (tool records, SPEC §3.2), ``_errors``, ``_entries``,
``_identifiers`` and ``_convenience`` (ids and names, §7.1, §7.7), ``_catalog`` (the catalog and
its guest view), ``_lookup`` and ``_search`` (§7.6, §7.5), ``_hints`` (§7.4), ``_contracts``
(§8.4), ``_quick_index`` and ``_surface`` (the model-facing tools, §4), ``_declarations`` and
``_namespace`` (the ``MCP`` namespace and its ``API`` files, §8.5-§8.7), ``_persist`` (views as
run-store documents, §10.7), ``_text`` (compact JSON, JavaScript trim), ``_bounded`` (linear-time
patterns and budgets of contract checks) and ``_offload`` (the steps the service runs in worker
processes). This module exports what the other packages use; tests of the catalog's
internals import the private modules by name (tests/unit/catalog).
"""

from ._bounded import is_fault
from ._catalog import Catalog, CatalogCounters, CatalogView, CounterSnapshot
from ._contracts import check_input_contract, check_output_contract, compile_schema
from ._entries import CatalogEntry
from ._errors import BridgeReplyError, CatalogRegistrationError
from ._namespace import McpNamespace, build_namespace
from ._offload import SCHEMA_FIELDS, GuestData, Problem, SchemaTexts, checked_registration, guest_data, registration_problem
from ._persist import entry_state, view_from_state, view_state
from ._registration import ParsedTools, parse_tools
from ._search import search_model
from ._surface import SurfaceDefinition, exec_description, surface_definitions, tool_surface
from ._text import compact_json, js_trim, nests_deeper, strict_json

__all__ = [
    "SCHEMA_FIELDS",
    "BridgeReplyError",
    "Catalog",
    "CatalogCounters",
    "CatalogEntry",
    "CatalogRegistrationError",
    "CatalogView",
    "CounterSnapshot",
    "GuestData",
    "McpNamespace",
    "ParsedTools",
    "Problem",
    "SchemaTexts",
    "SurfaceDefinition",
    "build_namespace",
    "check_input_contract",
    "check_output_contract",
    "checked_registration",
    "compact_json",
    "compile_schema",
    "entry_state",
    "exec_description",
    "guest_data",
    "is_fault",
    "js_trim",
    "nests_deeper",
    "parse_tools",
    "registration_problem",
    "search_model",
    "strict_json",
    "surface_definitions",
    "tool_surface",
    "view_from_state",
    "view_state",
]
