"""Search (SPEC §7.5): tokens, the exact tier, BM25 order, ties, limits and errors."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest

from cellblock.server.catalog import BridgeReplyError, Catalog, CatalogView
from cellblock.server.catalog._search import document_tokens, tokenize
from cellblock.server.config import CodeModeConfig

CONFIG = CodeModeConfig()


@pytest.mark.parametrize(
    ("text", "tokens"),
    [
        ("readFile2JSON v2", ["read", "file2", "json", "v2"]),
        ("getHTTPResponse", ["get", "httpresponse"]),
        ("host:core:read_file", ["host", "core", "read", "file"]),
        ("Größe_ändern", ["größe", "ändern"]),
        ("東京タワー tower", ["東京タワー", "tower"]),
        ("a1B2c", ["a1", "b2c"]),
        ("  ...  ", []),
        ("x\u0301y", ["x", "y"]),
    ],
)
def test_tokenize(text: str, tokens: list[str]) -> None:
    assert tokenize(text) == tokens


def test_document_uses_top_level_parameter_names_and_descriptions_for_host_only() -> None:
    schema = {"type": "object", "properties": {"cityName": {"type": "string", "description": "Town to look up"}}}
    view = Catalog().register(
        [
            {"source": "host", "name": "wx", "label": "Weather", "description": "Forecast", "parameters": schema},
            {"source": "client", "name": "wx", "parameters": schema},
        ]
    )
    host, client = view.get("host:core:wx"), view.get("client:client:wx")
    assert host is not None and client is not None
    assert document_tokens(host) == ["wx", "host", "core", "wx", "weather", "forecast", "city", "name", "town", "to", "look", "up"]
    assert document_tokens(client) == ["wx", "client", "client", "wx"]


def reference_bm25(docs: list[list[str]], query: list[str]) -> list[float]:
    """Textbook BM25 with the SPEC's idf, written independently of the implementation."""
    n = len(docs)
    avgdl = sum(len(d) for d in docs) / n
    df: dict[str, int] = {}
    for doc in docs:
        for token in set(doc):
            df[token] = df.get(token, 0) + 1
    scores = []
    for doc in docs:
        score = 0.0
        for token in dict.fromkeys(query):
            tf = doc.count(token)
            if tf:
                idf = math.log(1 + (n - df[token] + 0.5) / (df[token] + 0.5))
                score += idf * tf * 2.2 / (tf + 1.2 * (1 - 0.75 + 0.75 * len(doc) / avgdl))
        scores.append(score)
    return scores


def ids(results: list[dict[str, Any]]) -> list[str]:
    return [result["id"] for result in results]


def test_exact_tier_comes_first_then_bm25() -> None:
    view = Catalog().register(
        [
            {"source": "host", "name": "read", "description": "Open something"},
            {"source": "host", "name": "files", "description": "read read read files read"},
            {"source": "host", "owner": "fs", "name": "read", "description": "Read"},
            {"source": "client", "name": "reader", "description": "read"},
        ]
    )
    found = ids(view.search("  READ ", None, config=CONFIG))
    # Both entries named "read" are exact matches, by id; then BM25 hits.
    assert found[:2] == ["host:core:read", "host:fs:read"]
    assert set(found[2:]) == {"host:core:files", "client:client:reader"}
    assert len(found) == 4


def test_exact_tier_matches_ids_case_insensitively() -> None:
    view = Catalog().register(
        [{"source": "host", "name": "alpha", "description": "beta"}, {"source": "host", "name": "beta"}]
    )
    assert ids(view.search("HOST:CORE:ALPHA", None, config=CONFIG))[0] == "host:core:alpha"


def test_bm25_order_matches_the_formula() -> None:
    rng = random.Random(7)
    words = ["alpha", "beta", "gamma", "delta", "omega", "sigma", "kappa", "zeta"]
    tools = [
        {"source": "host", "name": f"t{i:02d}", "description": " ".join(rng.choice(words) for _ in range(rng.randint(0, 9)))}
        for i in range(40)
    ]
    view = Catalog().register(tools)
    guest = view.guest_entries
    docs = [document_tokens(entry) for entry in guest]
    for query in ["alpha", "beta gamma", "omega omega kappa", "zeta sigma alpha delta"]:
        scores = reference_bm25(docs, tokenize(query))
        expected = sorted((i for i in range(len(guest)) if scores[i] > 0), key=lambda i: (-scores[i], guest[i].id))
        assert [e.id for e in view.rank(query)] == [guest[i].id for i in expected]


def test_hand_computed_ranking_prefers_shorter_document_and_rarer_term() -> None:
    view = Catalog().register(
        [
            {"source": "host", "name": "a", "description": "weather"},
            {"source": "host", "name": "b", "description": "weather report for the whole region today"},
            {"source": "host", "name": "c", "description": "storm weather"},
            {"source": "host", "name": "d", "description": "nothing"},
        ]
    )
    # "storm" is rarer than "weather", so c wins; a's document is shorter than b's.
    assert [e.id for e in view.rank("storm weather")] == ["host:core:c", "host:core:a", "host:core:b"]


def test_ties_are_broken_by_id() -> None:
    view = Catalog().register(
        [
            {"source": "host", "name": "beta", "description": "fetch weather"},
            {"source": "host", "name": "alpha", "description": "fetch weather"},
            {"source": "host", "name": "gamma", "description": "unrelated"},
        ]
    )
    assert [e.id for e in view.rank("weather")] == ["host:core:alpha", "host:core:beta"]


def test_query_without_tokens_returns_guest_view_in_id_order() -> None:
    view = Catalog().register(
        [
            {"source": "host", "name": "b"},
            {"source": "mcp", "owner": "gh", "name": "a"},
            {"source": "client", "name": "c"},
            {"source": "host", "name": "a"},
        ]
    )
    assert ids(view.search("?!", None, config=CONFIG)) == ["client:client:c", "host:core:a", "host:core:b"]
    assert ids(view.search("", None, config=CONFIG)) == ["client:client:c", "host:core:a", "host:core:b"]


def test_query_without_tokens_but_exact_match() -> None:
    view = Catalog().register([{"source": "host", "name": "?!"}, {"source": "host", "name": "other"}])
    assert ids(view.search("?!", None, config=CONFIG)) == ["host:core:?!"]


def test_query_with_tokens_and_no_hit_is_empty() -> None:
    view = Catalog().register([{"source": "host", "name": "read"}])
    assert view.search("zebra", None, config=CONFIG) == []


def test_mcp_entries_are_never_found() -> None:
    view = Catalog().register(
        [{"source": "mcp", "owner": "gh", "name": "create_issue"}, {"source": "host", "name": "other"}]
    )
    assert view.search("create_issue", None, config=CONFIG) == []
    assert view.search("mcp:gh:create_issue", None, config=CONFIG) == []


def many(count: int) -> CatalogView:
    return Catalog().register([{"source": "host", "name": f"t{i:02d}", "description": "shared"} for i in range(count)])


@pytest.mark.parametrize(
    ("options", "config", "expected"),
    [
        (None, CONFIG, 8),
        ({}, CONFIG, 8),
        ({"limit": 3}, CONFIG, 3),
        ({"limit": 3.0}, CONFIG, 3),
        ({"limit": 1000}, CONFIG, 50),
        ({"limit": 1000}, CodeModeConfig.from_json({"maxSearchLimit": 3}), 3),
        (None, CodeModeConfig.from_json({"maxSearchLimit": 3}), 3),
        (None, CodeModeConfig.from_json({"searchDefaultLimit": 2}), 2),
    ],
)
def test_limits(options: Any, config: CodeModeConfig, expected: int) -> None:
    assert len(many(60).search("shared", options, config=config)) == expected


@pytest.mark.parametrize(
    ("query", "options", "message"),
    [
        (5, None, "tools.search query must be a string."),
        (None, None, "tools.search query must be a string."),
        ("x", "limit", "tools.search options must be an object."),
        ("x", [3], "tools.search options must be an object."),
        ("x", 3, "tools.search options must be an object."),
        ("x", {"limit": 0}, "tools.search limit must be a positive integer."),
        ("x", {"limit": -2}, "tools.search limit must be a positive integer."),
        ("x", {"limit": 1.5}, "tools.search limit must be a positive integer."),
        ("x", {"limit": True}, "tools.search limit must be a positive integer."),
        ("x", {"limit": None}, "tools.search limit must be a positive integer."),
        ("x", {"limit": "3"}, "tools.search limit must be a positive integer."),
        (3, {"limit": 0}, "tools.search query must be a string."),
    ],
)
def test_argument_errors(query: Any, options: Any, message: str) -> None:
    with pytest.raises(BridgeReplyError) as caught:
        many(2).search(query, options, config=CONFIG)
    assert caught.value.message == message
    assert caught.value.provenance == "input"


def test_results_are_compact_entries() -> None:
    view = Catalog().register([{"source": "host", "name": "read", "label": "Read", "description": "Reads"}])
    assert view.search("read", {"limit": 1}, config=CONFIG) == [
        {
            "id": "host:core:read",
            "source": "host",
            "sourceName": "core",
            "name": "read",
            "label": "Read",
            "description": "Reads",
            "input": "unknown",
        }
    ]


def test_each_search_counts() -> None:
    catalog = Catalog()
    view = catalog.register([{"source": "host", "name": "read"}])
    view.search("read", None, config=CONFIG)
    with pytest.raises(BridgeReplyError):
        view.search(1, None, config=CONFIG)
    assert catalog.counters.snapshot().search_count == 2


def test_a_query_over_4096_characters_is_b28_with_input_provenance_and_4096_is_searched() -> None:
    view = many(3)
    assert ids(view.search("shared " + "x" * 4089, None, config=CONFIG)) == ["host:core:t00", "host:core:t01", "host:core:t02"]
    with pytest.raises(BridgeReplyError) as caught:
        view.search("shared " + "x" * 4090, None, config=CONFIG)
    assert (caught.value.message, caught.value.provenance) == (
        "tools.search query is longer than 4096 characters; search with a few words.",
        "input",
    )
    # The type check comes first; a 1 MB query is refused before it is tokenized.
    with pytest.raises(BridgeReplyError):
        view.search("q " * 500_000, None, config=CONFIG)
