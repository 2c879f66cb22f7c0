"""Registration (SPEC §3.2, §7.1): validation, exclusions, modes, counters, views."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from cellblock.server.catalog import Catalog, CatalogRegistrationError
from cellblock.server.config import CodeModeConfig

OK = {"source": "host", "name": "ok"}

INVALID_TOOLS: list[tuple[str, Any, str]] = [
    ("not-an-object", "read", "tool must be an object"),
    ("source-missing", {"name": "x"}, "source is required and must be host, mcp or client"),
    ("source-unknown", {"source": "web", "name": "x"}, "source is required and must be host, mcp or client"),
    ("mcp-owner-missing", {"source": "mcp", "name": "x"}, "owner (the MCP server name) is required for mcp tools"),
    ("owner-colon", {"source": "host", "owner": "a:b", "name": "x"}, "owner must not contain ':' or whitespace"),
    ("owner-space", {"source": "client", "owner": "a b", "name": "x"}, "owner must not contain ':' or whitespace"),
    ("owner-blank", {"source": "host", "owner": "  ", "name": "x"}, "owner must not be empty"),
    ("owner-not-string", {"source": "host", "owner": 3, "name": "x"}, "owner must be a string"),
    ("name-missing", {"source": "host"}, "name is required and must be a non-empty string"),
    ("name-empty", {"source": "host", "name": ""}, "name is required and must be a non-empty string"),
    ("name-control", {"source": "host", "name": "a\nb"}, "name must not contain control characters"),
    ("name-del", {"source": "host", "name": "a\x7f"}, "name must not contain control characters"),
    ("label-type", {"source": "host", "name": "x", "label": 5}, "label must be a string"),
    ("description-type", {"source": "host", "name": "x", "description": []}, "description must be a string"),
    ("replay-safe-type", {"source": "host", "name": "x", "replaySafe": "yes"}, "replaySafe must be a boolean"),
    ("side-effecting-type", {"source": "host", "name": "x", "sideEffecting": 1}, "sideEffecting must be a boolean"),
    ("direct-only-type", {"source": "client", "name": "x", "directOnly": 0}, "directOnly must be a boolean"),
    ("operation-on-host", {"source": "host", "name": "x", "operation": "tool"}, "operation is only allowed for mcp tools"),
    (
        "operation-unknown",
        {"source": "mcp", "owner": "gh", "name": "x", "operation": "tools.list"},
        "operation must be one of tool, resources.list, resources.read, prompts.list, prompts.get",
    ),
    (
        "host-parameters-bad-type",
        {"source": "host", "name": "x", "parameters": {"type": "strnig"}},
        "parameters is not a valid JSON Schema",
    ),
    (
        "host-parameters-not-schema",
        {"source": "host", "name": "x", "parameters": [1]},
        "parameters is not a valid JSON Schema",
    ),
    (
        "host-output-bad",
        {"source": "host", "name": "x", "outputSchema": {"type": "object", "required": "a"}},
        "outputSchema is not a valid JSON Schema",
    ),
    (
        "host-unsupported-draft",
        {"source": "host", "name": "x", "parameters": {"$schema": "http://example.com/my-draft", "type": "object"}},
        'parameters names an unsupported $schema: "http://example.com/my-draft"',
    ),
]

#: The name an invalid tool's error gives it: its id when source, owner and name are valid,
#: else its name (JSON-quoted); tools with neither are named by index only.
EXPECTED_LABELS = {
    json.dumps(tool, sort_keys=True): label
    for tool, label in [
        ({"name": "x"}, '"x"'),
        ({"source": "web", "name": "x"}, '"x"'),
        ({"source": "mcp", "name": "x"}, '"x"'),
        ({"source": "host", "owner": "a:b", "name": "x"}, '"x"'),
        ({"source": "client", "owner": "a b", "name": "x"}, '"x"'),
        ({"source": "host", "owner": "  ", "name": "x"}, '"x"'),
        ({"source": "host", "owner": 3, "name": "x"}, '"x"'),
        ({"source": "host", "name": "a\nb"}, '"a\\nb"'),
        ({"source": "host", "name": "a\x7f"}, '"a\x7f"'),
        ({"source": "host", "name": "x", "label": 5}, "host:core:x"),
        ({"source": "host", "name": "x", "description": []}, "host:core:x"),
        ({"source": "host", "name": "x", "replaySafe": "yes"}, "host:core:x"),
        ({"source": "host", "name": "x", "sideEffecting": 1}, "host:core:x"),
        ({"source": "client", "name": "x", "directOnly": 0}, "client:client:x"),
        ({"source": "host", "name": "x", "operation": "tool"}, "host:core:x"),
        ({"source": "mcp", "owner": "gh", "name": "x", "operation": "tools.list"}, "mcp:gh:x"),
        ({"source": "host", "name": "x", "parameters": {"type": "strnig"}}, "host:core:x"),
        ({"source": "host", "name": "x", "parameters": [1]}, "host:core:x"),
        ({"source": "host", "name": "x", "outputSchema": {"type": "object", "required": "a"}}, "host:core:x"),
        ({"source": "host", "name": "x", "parameters": {"$schema": "http://example.com/my-draft", "type": "object"}}, "host:core:x"),
    ]
}


@pytest.mark.parametrize(("tool", "problem"), [c[1:] for c in INVALID_TOOLS], ids=[c[0] for c in INVALID_TOOLS])
def test_invalid_tool_fails_whole_registration_naming_index(tool: Any, problem: str) -> None:
    catalog = Catalog()
    before = catalog.register([{"source": "host", "name": "kept"}])
    with pytest.raises(CatalogRegistrationError) as caught:
        catalog.register([OK, {"source": "client", "name": "fine"}, tool])
    assert caught.value.index == 2
    assert caught.value.problem.startswith(problem)
    # The message names the tool itself where it can (SPEC §3.2 item 4): its id, else its name.
    label = EXPECTED_LABELS.get(json.dumps(tool, sort_keys=True))
    named = f"tool 2 ({label}): " if label else "tool 2: "
    assert str(caught.value).startswith(named + problem), str(caught.value)
    assert catalog.view is before
    assert [e.id for e in catalog.view.entries] == ["host:core:kept"]


def test_duplicate_ids_fail() -> None:
    with pytest.raises(CatalogRegistrationError) as caught:
        Catalog().register([OK, {"source": "client", "name": "ok"}, {"source": "host", "owner": " core ", "name": "ok"}])
    assert (caught.value.index, caught.value.problem) == (2, "duplicate id host:core:ok (also tool 0)")


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        ({"mode": "upsert"}, "mode must be replace or merge"),
        ({"allow": "read"}, "allow must be a list of strings"),
        ({"deny": [1]}, "deny must be a list of strings"),
        ({"direct_tool_names": {"a": 1}}, "directToolNames must be a list of strings"),
        # No item longer than the longest id can match; a list longer than a registration's tools is refused too.
        ({"allow": ["ok", "x" * 521]}, "allow item 1 is longer than 520 characters (the longest tool id)"),
        ({"deny": ["x" * 5_000_000]}, "deny item 0 is longer than 520 characters (the longest tool id)"),
        ({"direct_tool_names": ["ok"] * 10_001}, "directToolNames has 10001 items, more than 10000"),
    ],
)
def test_malformed_registration_fields(kwargs: dict[str, Any], problem: str) -> None:
    with pytest.raises(CatalogRegistrationError) as caught:
        Catalog().register([OK], **kwargs)
    assert (caught.value.index, str(caught.value)) == (None, problem)


def test_tools_must_be_a_list() -> None:
    with pytest.raises(CatalogRegistrationError):
        Catalog().register({"source": "host", "name": "x"})


def test_valid_schemas_and_untrusted_data() -> None:
    catalog = Catalog()
    view = catalog.register(
        [
            {"source": "host", "name": "d7", "parameters": {"$schema": "http://json-schema.org/draft-07/schema#"}},
            {"source": "host", "name": "d4", "parameters": {"$schema": "http://json-schema.org/draft-04/schema"}},
            {"source": "mcp", "owner": " gh ", "name": "m", "parameters": {"type": "strnig"}, "outputSchema": {"x": 1}},
            {"source": "client", "name": "c", "parameters": "anything", "replaySafe": True, "sideEffecting": True},
        ]
    )
    mcp = view.get("mcp:gh:m")
    client = view.get("client:client:c")
    assert mcp is not None and client is not None
    assert mcp.parameters == {"type": "strnig"} and mcp.output_schema is None and mcp.operation == "tool"
    assert client.parameters == "anything" and not client.replay_safe and not client.side_effecting
    assert catalog.ignored_fields == ((2, "mcp:gh:m", "outputSchema"),)


def test_entry_fields_and_compact_key_order() -> None:
    view = Catalog().register(
        [
            {
                "source": "host",
                "name": "read",
                "label": "Read",
                "description": "Reads",
                "parameters": {"type": "object", "properties": {"p": {"type": "string"}}, "required": ["p"]},
                "outputSchema": {"type": "string"},
                "replaySafe": True,
                "sideEffecting": False,
                "futureField": 1,
            }
        ]
    )
    (entry,) = view.entries
    assert (entry.replay_safe, entry.side_effecting, entry.operation) == (True, False, None)
    assert list(entry.compact()) == ["id", "source", "sourceName", "name", "label", "description", "input", "output"]
    assert entry.compact()["input"] == "{ p: string }"
    assert view.all_tools() == [entry.compact()]


def test_registered_schemas_are_private_copies() -> None:
    schema: dict[str, Any] = {"type": "object", "properties": {}}
    view = Catalog().register([{"source": "host", "name": "x", "parameters": schema}])
    schema["properties"]["new"] = {"type": "string"}
    assert view.describe("x")["parameters"] == {"type": "object", "properties": {}}


def test_exclusions() -> None:
    view = Catalog().register(
        [
            {"source": "host", "name": "read"},
            {"source": "host", "name": "secret"},
            {"source": "host", "owner": "fs", "name": "rm"},
            {"source": "host", "name": "direct", "directOnly": True},
            {"source": "host", "name": "tool_search"},
            {"source": "client", "name": "tool_call"},
            {"source": "mcp", "owner": "gh", "name": "tool_describe"},
            {"source": "host", "name": "tool_search_code"},
            {"source": "host", "name": "exec"},
        ],
        deny=["secret", "host:fs:rm"],
    )
    assert [e.id for e in view.entries] == ["host:core:exec", "host:core:read"]


def test_allow_matches_whole_ids_or_names() -> None:
    tools = [
        {"source": "host", "name": "read"},
        {"source": "host", "name": "reader"},
        {"source": "mcp", "owner": "gh", "name": "issue"},
        {"source": "client", "name": "pick"},
    ]
    view = Catalog().register(tools, allow=["read", "mcp:gh:issue", "host:core:rea"])
    assert [e.id for e in view.entries] == ["host:core:read", "mcp:gh:issue"]
    assert Catalog().register(tools, allow=[]).entries == ()
    assert len(Catalog().register(tools, allow=None).entries) == 4
    both = Catalog().register(tools, allow=["read", "pick"], deny=["client:client:pick"])
    assert [e.id for e in both.entries] == ["host:core:read"]


def test_sources_and_guest_view() -> None:
    view = Catalog().register(
        [
            {"source": "mcp", "owner": "gh", "name": "a"},
            {"source": "mcp", "owner": "gh", "name": "b"},
            {"source": "client", "name": "c"},
            {"source": "host", "name": "d"},
        ]
    )
    assert view.sources == {"host": 1, "mcp": 2, "client": 1}
    assert view.size == 4
    assert [e.id for e in view.guest_entries] == ["client:client:c", "host:core:d"]
    assert view.has_host and view.has_mcp


def test_replace_starts_a_new_session_and_merge_keeps_it() -> None:
    catalog = Catalog()
    first = catalog.register([{"source": "host", "name": "a", "description": "old"}])
    scope = catalog.counters.counter_scope
    assert re.fullmatch(r"[0-9a-f]{12}", scope)
    first.search("a", None, config=CodeModeConfig())
    first.describe("a")
    catalog.counters.count_call()
    merged = catalog.register(
        [{"source": "host", "name": "a", "description": "new"}, {"source": "host", "name": "b"}], mode="merge"
    )
    snap = catalog.counters.snapshot()
    assert (snap.counter_scope, snap.search_count, snap.describe_count, snap.call_count) == (scope, 1, 1, 1)
    assert [(e.id, e.description) for e in merged.entries] == [("host:core:a", "new"), ("host:core:b", "")]
    # A run keeps the view it started with.
    assert [(e.id, e.description) for e in first.entries] == [("host:core:a", "old")]
    assert first.counters is merged.counters

    replaced = catalog.register([{"source": "client", "name": "c"}])
    snap = catalog.counters.snapshot()
    assert snap.counter_scope != scope and re.fullmatch(r"[0-9a-f]{12}", snap.counter_scope)
    assert (snap.search_count, snap.describe_count, snap.call_count) == (0, 0, 0)
    assert [e.id for e in replaced.entries] == ["client:client:c"]
    # The old session's views still count into the old session.
    first.search("a", None, config=CodeModeConfig())
    assert first.counters.snapshot().search_count == 2
    assert catalog.counters.snapshot().search_count == 0


def test_merge_with_excluded_replacement_removes_the_entry() -> None:
    catalog = Catalog()
    catalog.register([{"source": "host", "name": "a"}, {"source": "host", "name": "b"}])
    view = catalog.register([{"source": "host", "name": "a"}], mode="merge", deny=["a"])
    assert [e.id for e in view.entries] == ["host:core:b"]


def test_direct_tools() -> None:
    catalog = Catalog()
    catalog.register(
        [
            {"source": "host", "name": "shown", "directOnly": True},
            {"source": "client", "name": "ui", "directOnly": True},
            {"source": "host", "name": "exec", "directOnly": True},
            {"source": "host", "name": "wait"},
            {"source": "host", "name": "read"},
            {"source": "client", "name": "pick"},
            {"source": "mcp", "owner": "gh", "name": "issue"},
        ],
        direct_tool_names=["read", "wait", "pick", "mcp:gh:issue"],
    )
    view = catalog.view
    assert [t["name"] for t in view.direct_tools()] == ["ui", "read", "shown"]
    # directOnly tools stay out of the catalog, except one named exec (catalogued instead).
    assert [e.id for e in view.entries] == [
        "client:client:pick",
        "host:core:exec",
        "host:core:read",
        "host:core:wait",
        "mcp:gh:issue",
    ]
    merged = catalog.register([{"source": "host", "name": "write"}], mode="merge", direct_tool_names=["write"])
    assert [t["name"] for t in merged.direct_tools()] == ["ui", "read", "shown", "write"]


def test_schema_check_results_are_stable_when_remembered() -> None:
    bad = {"source": "host", "name": "x", "parameters": {"type": "object", "properties": {"a": {"minLength": -1}}}}
    problems = []
    for _ in range(2):
        with pytest.raises(CatalogRegistrationError) as caught:
            Catalog().register([bad])
        problems.append(caught.value.problem)
    assert problems[0] == problems[1]
    assert problems[0].startswith("parameters is not a valid JSON Schema: /properties/a/minLength: ")
