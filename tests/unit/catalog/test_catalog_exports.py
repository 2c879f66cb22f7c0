"""The pinned public surface of cellblock.server.catalog: what the other packages use, no more."""

from __future__ import annotations

import cellblock.server.catalog as catalog

EXPECTED = {
    "BridgeReplyError", "Catalog", "CatalogEntry", "CatalogRegistrationError", "CatalogView", "McpNamespace",
    "build_namespace", "check_input_contract", "check_output_contract", "compact_json", "is_fault", "exec_description", "js_trim", "strict_json",
    # The value nesting bound counted on a text, the host's second layer (SPEC §8.8 rule 7).
    "nests_deeper",
    "tool_surface", "CatalogCounters", "CounterSnapshot", "view_from_state", "view_state", "entry_state",
    # The steps the service runs in worker processes (issue 11).
    "GuestData", "SchemaTexts", "SCHEMA_FIELDS", "guest_data", "registration_problem", "search_model",
    # PutCatalog's one worker call also builds its answer and view from the checked catalog (issue 11 item 1).
    "checked_registration", "Problem",
    # GetToolSurface's definitions from the worker's schema texts (issue 11 item 1).
    "surface_definitions", "SurfaceDefinition",
    # A worker process checks a long tool input or result against its entry's schema (issue 11 item 1).
    "compile_schema",
    # PutCatalog builds a registration's entries on the loop in slices (issue 11 item 1).
    "ParsedTools", "parse_tools",
}  # fmt: skip


def test_exported_names() -> None:
    assert set(catalog.__all__) == EXPECTED
    for name in catalog.__all__:
        assert getattr(catalog, name) is not None
