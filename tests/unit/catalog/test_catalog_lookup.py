"""Lookup, suggestions (SPEC §7.6), convenience names (§7.7) and identifiers (§8.5)."""

from __future__ import annotations

from typing import Any

import pytest

from cellblock.server.catalog import BridgeReplyError, Catalog, CatalogView, compact_json
from cellblock.server.catalog._convenience import normalise_tool_name
from cellblock.server.catalog._identifiers import TOOL_RESERVED, assign_identifiers, server_identifiers, to_identifier

TAIL = " Find tools with tools.search, inspect one with tools.describe, then call it with its exact id or name."


def view_of(*tools: dict[str, Any]) -> CatalogView:
    return Catalog().register(list(tools))


FILE_TOOLS: list[dict[str, Any]] = [
    {"source": "host", "name": "read"},
    {"source": "host", "name": "read_file"},
    {"source": "host", "owner": "fs", "name": "write_file"},
    {"source": "client", "owner": "app", "name": "select_file", "description": "Use instead of read_files for dialogs"},
    {"source": "mcp", "owner": "gh", "name": "create_issue"},
]
FILES = view_of(*FILE_TOOLS)


def reply(view: CatalogView, text: Any, helper: Any = "tools.call") -> BridgeReplyError:
    with pytest.raises(BridgeReplyError) as caught:
        view.resolve(text, helper)
    return caught.value


def test_exact_id_then_exact_name() -> None:
    assert FILES.resolve("host:core:read").id == "host:core:read"
    assert FILES.resolve("write_file").id == "host:fs:write_file"
    view = view_of({"source": "host", "name": "host:core:b"}, {"source": "host", "name": "b"})
    assert view.resolve("host:core:b").id == "host:core:b"


def test_ambiguous_name_lists_three_ids_then_dots() -> None:
    view = view_of(*({"source": "host", "owner": f"o{i}", "name": "dup"} for i in (3, 1, 4, 2)))
    error = reply(view, "dup")
    assert error.message == (
        'Ambiguous tool name "dup": it matches 4 tools (host:o1:dup, host:o2:dup, host:o3:dup, ...). '
        "Use an exact tool id."
    )
    assert error.provenance == "internal"
    two = view_of({"source": "host", "name": "dup"}, {"source": "client", "name": "dup"})
    assert reply(two, "dup").message == (
        'Ambiguous tool name "dup": it matches 2 tools (client:client:dup, host:core:dup). Use an exact tool id.'
    )


def test_unknown_with_hand_scored_suggestions() -> None:
    # read: 40 (name in needle) + 40 (name is a needle token) + 12 ("read") = 92
    # read_file: 40 (name in needle) + 12 ("read") = 52; select_file: 8 (description); write_file: 0
    error = reply(FILES, "read_files")
    assert error.message == "Unknown tool: read_files. Did you mean: read, read_file, select_file?" + TAIL
    assert error.provenance == "internal"
    # read_files_x: 40 (id contains the needle) + 24 ("read", "files") = 64, between read and read_file.
    more = view_of(*FILE_TOOLS, {"source": "host", "name": "read_files_x"})
    assert reply(more, "read_files").message == (
        "Unknown tool: read_files. Did you mean: read, read_files_x, read_file?" + TAIL
    )


def test_suggestions_use_ids_for_shared_names_and_sort_ties_by_text() -> None:
    view = view_of(
        {"source": "host", "name": "read"},
        {"source": "host", "owner": "zz", "name": "read"},
        {"source": "host", "name": "read_file"},
    )
    assert reply(view, "read_files").message == (
        "Unknown tool: read_files. Did you mean: host:core:read, host:zz:read, read_file?" + TAIL
    )


def test_label_or_description_bonus_is_exactly_eight() -> None:
    # aa_bb_cc_dd: 4 needle tokens x 12 = 48. "~": 40 (name in needle) + 8 (description) = 48,
    # so the tie is broken by text. zz_aa: 12 (token "aa").
    view = view_of(
        {"source": "host", "name": "~", "description": "see aa bb cc dd ~ here"},
        {"source": "host", "name": "aa_bb_cc_dd"},
        {"source": "host", "name": "zz_aa"},
        {"source": "host", "name": "unrelated"},
    )
    assert reply(view, "aa bb cc dd ~").message == (
        "Unknown tool: aa bb cc dd ~. Did you mean: aa_bb_cc_dd, ~, zz_aa?" + TAIL
    )


def test_id_containing_the_needle_scores() -> None:
    view = view_of({"source": "host", "owner": "weather", "name": "get"}, {"source": "host", "name": "other"})
    assert reply(view, "eathe").message == "Unknown tool: eathe. Did you mean: get?" + TAIL


def test_unknown_without_suggestions() -> None:
    assert reply(FILES, "zzz").message == "Unknown tool: zzz." + TAIL


def test_mcp_ids_are_unknown_and_suggest_nothing() -> None:
    assert reply(FILES, "mcp:gh:create_issue").message == "Unknown tool: mcp:gh:create_issue." + TAIL
    # The MCP tool's name is not in the guest view either.
    assert reply(FILES, "create_issue").message.startswith("Unknown tool: create_issue.")


def test_echoed_text_is_cut_to_200_characters() -> None:
    message = reply(FILES, "q" * 300).message
    assert "q" * 200 + "." in message and "q" * 201 not in message
    ambiguous = view_of({"source": "host", "name": "n" * 250}, {"source": "client", "name": "n" * 250})
    assert f'"{"n" * 200}"' in reply(ambiguous, "n" * 250).message


@pytest.mark.parametrize(
    ("helper", "message"),
    [
        ("tools.describe", "tools.describe id must be a string."),
        ("tools.call", "tools.call id must be a string."),
        ("tools.callValue", "tools.callValue id must be a string."),
    ],
)
def test_id_type_errors(helper: str, message: str) -> None:
    error = reply(FILES, 42, helper)
    assert (error.message, error.provenance) == (message, "input")


def test_describe_counts_and_adds_schemas() -> None:
    catalog = Catalog()
    view = catalog.register(
        [
            {"source": "host", "name": "h", "parameters": {"type": "object"}, "outputSchema": {"type": "string"}},
            {"source": "client", "name": "c", "outputSchema": {"type": "string"}},
        ]
    )
    assert view.describe("h") == {
        "id": "host:core:h",
        "source": "host",
        "sourceName": "core",
        "name": "h",
        "description": "",
        "input": "{ ... }",
        "output": "string",
        "parameters": {"type": "object"},
        "outputSchema": {"type": "string"},
    }
    assert view.describe("client:client:c") == {
        "id": "client:client:c",
        "source": "client",
        "sourceName": "client",
        "name": "c",
        "description": "",
        "input": "unknown",
        "parameters": {},
    }
    with pytest.raises(BridgeReplyError):
        view.describe(None)
    assert catalog.counters.snapshot().describe_count == 3


@pytest.mark.parametrize(
    ("name", "safe"),
    [("read-file", "read_file"), ("2fa", "tool_2fa"), ("$ok_1", "$ok_1"), ("héllo wörld", "h_llo_w_rld"), ("a.b", "a_b")],
)
def test_normalise_tool_name(name: str, safe: str) -> None:
    assert normalise_tool_name(name) == safe


def test_convenience_names_only_for_unique_unreserved_guest_names() -> None:
    view = view_of(
        {"source": "host", "name": "read-file"},
        {"source": "host", "name": "a-b"},
        {"source": "client", "name": "a_b"},
        {"source": "host", "name": "toString"},
        {"source": "host", "name": "callValue"},
        {"source": "host", "name": "__cellblock_x"},
        {"source": "host", "name": "__proto__"},
        {"source": "mcp", "owner": "gh", "name": "create_issue"},
        {"source": "client", "name": "2fa"},
    )
    assert view.convenience_names() == {"tool_2fa": "client:client:2fa", "read_file": "host:core:read-file"}


@pytest.mark.parametrize(
    ("name", "identifier"),
    [
        ("create_issue", "createIssue"),
        ("chrome-devtools", "chromeDevtools"),
        ("GitHub", "gitHub"),
        ("1st-server", "stServer"),
        ("---", "server"),
        ("123", "server"),
        ("my server.v2", "myServerV2"),
    ],
)
def test_to_identifier(name: str, identifier: str) -> None:
    assert to_identifier(name, "server") == identifier


def test_server_identifiers_are_unique_and_avoid_reserved_names() -> None:
    assert server_identifiers(["tools", "constructor", "a-b", "a_b", "a b", "MCP"]) == {
        "MCP": "mCP",
        "a b": "aB",
        "a-b": "aB2",
        "a_b": "aB3",
        "constructor": "constructor2",
        "tools": "tools2",
    }


def test_tool_identifiers_avoid_reserved_names() -> None:
    names = ["delete", "class", "prototype", "resources", "$api"]
    assert assign_identifiers(names, reserved=TOOL_RESERVED, fallback="tool") == [
        "delete2",
        "class2",
        "prototype2",
        "resources2",
        "api",
    ]


DESCRIBED: list[dict[str, Any]] = [
    {"source": "host", "name": "h", "label": "H", "description": "reads ☃", "parameters": {"type": "object", "properties": {"n": {"type": "number", "default": 1.0}}}, "outputSchema": {"type": "string"}},
    {"source": "host", "name": "bare"},
    {"source": "client", "name": "c", "outputSchema": {"type": "string"}, "parameters": {"type": "object", "description": "lone \ud800"}},
]


@pytest.mark.parametrize("text", ["h", "bare", "client:client:c"])
def test_describe_json_from_the_workers_schema_texts_equals_the_described_entry(text: str) -> None:
    view = view_of(*DESCRIBED)
    entry = view.describe_entry(text)
    texts = (compact_json(entry.parameters) if entry.parameters is not None else "", compact_json(entry.output_schema) if entry.output_schema is not None else "")
    assert entry.describe_json(texts) == entry.describe_json() == compact_json(view.describe(text))


def test_describe_json_uses_the_given_schema_texts_rather_than_serializing_again() -> None:
    entry = view_of(*DESCRIBED).describe_entry("h")
    text = entry.describe_json(('{"from":"worker"}', '{"out":"worker"}'))
    assert text.endswith(',"parameters":{"from":"worker"},"outputSchema":{"out":"worker"}}'), text


def test_an_id_text_longer_than_any_catalog_id_is_b07_without_suggestions_and_cut() -> None:
    from cellblock.server.catalog._entries import SOURCES
    from cellblock.server.limits import MAX_CATALOG_ID_CHARS, MAX_TOOL_IDENTIFIER_CHARS

    assert MAX_CATALOG_ID_CHARS == max(len(s) for s in SOURCES) + 2 + 2 * MAX_TOOL_IDENTIFIER_CHARS == 520
    longest_owner, longest_name = "o" * MAX_TOOL_IDENTIFIER_CHARS, "read" + "n" * (MAX_TOOL_IDENTIFIER_CHARS - 4)
    view = view_of(*FILE_TOOLS, {"source": "client", "owner": longest_owner, "name": longest_name})
    longest_id = f"client:{longest_owner}:{longest_name}"
    assert len(longest_id) == MAX_CATALOG_ID_CHARS
    assert view.resolve(longest_id).id == longest_id
    # One character more names nothing; the same text would otherwise suggest "read".
    for text in ("read " + longest_id, "read " * 200_000):
        message = reply(view, text).message
        assert message == f"Unknown tool: {text[:200]}." + TAIL
        assert len(message) < 400
    assert "Did you mean: read" in reply(view, "read " + "x" * 500).message


def test_suggestions_stop_at_their_budget_with_what_was_scored() -> None:
    # 3000 entries in id order; the last one would score highest.
    tools = [{"source": "host", "name": f"tool_{i:04d}", "description": "d" * 5000} for i in range(2999)]
    view = view_of(*tools, {"source": "host", "name": "zz_target"})
    lookup = view._lookup  # the budget is a parameter of the lookup, not of the view
    # A spent budget still scores the first entries (one clock read per 32), never the whole view.
    assert lookup.suggestions("zz_target_x", budget_ms=0.0) == []
    assert lookup.suggestions("tool_0000_x", budget_ms=0.0) == ["tool_0000", "tool_0001", "tool_0002"]
    assert lookup.suggestions("zz_target_x", budget_ms=60_000.0) == ["zz_target"]
    # Scored texts are kept, so within the default budget the whole view is soon scored.
    assert "Did you mean: zz_target" in reply(view, "zz_target_x").message


def test_suggestions_search_only_the_first_1024_description_characters() -> None:
    view = view_of(
        {"source": "host", "name": "early", "description": "x" * 1000 + "needle!"},
        {"source": "host", "name": "late", "description": "x" * 1024 + "needle!"},
    )
    assert reply(view, "needle!").message == "Unknown tool: needle!. Did you mean: early?" + TAIL


def test_a_long_unknown_id_against_a_large_view_returns_quickly() -> None:
    import time

    tools = [
        {"source": "host", "owner": f"o{i % 7}", "name": f"t_{i}", "label": "l" * 200, "description": "ab " * 40_000}
        for i in range(3000)
    ]
    view = view_of(*tools)
    view.resolve("t_1")  # the lookup is built once per view
    for text in ("ab " * 173, "a" * 520, "ab " * 350_000):
        started = time.perf_counter()
        reply(view, text)
        assert time.perf_counter() - started < 0.06, len(text)
