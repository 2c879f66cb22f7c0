"""The ``MCP`` namespace's guest data and ``API`` files say what main's said, byte for byte (SPEC §8.5-§8.7).

The namespace build renders each tool block once and finds every selector's tools in one pass
(3,000 tools: 4.7 s -> 2.2 s); :data:`GOLDEN` is the digest main at b57af03 gave for the catalog below.
The guest data is sent in a smaller shape since (each text piece once in ``mcp.texts``, declaration
texts as templates of its indexes, schemas and defaults as JSON text): :func:`_decoded` turns it back
into main's shape (what the guest controller reads out of it), so the digest still covers every
declaration text (server headers, ``$api()`` selector headers, ``API`` files) and every tool's data.
"""

from __future__ import annotations

import hashlib
import json
import random
from typing import Any

from cellblock.server.catalog import Catalog, build_namespace, compact_json

GOLDEN = "5e51882a13ccedc0240b5e6094907da8452f03370f384bc64bd33dfdb699f9fc"

_OPERATIONS = ["tool"] * 30 + ["resources.list", "resources.read", "prompts.list", "prompts.get"]


def _schema(rng: random.Random, i: int) -> dict[str, Any] | None:
    if i % 9 == 0:
        return None
    props: dict[str, Any] = {}
    for j in range(rng.randint(0, 6)):
        kind = rng.choice(["string", "integer", "number", "boolean", "array", "object", "enum", "union"])
        prop: dict[str, Any] = {"type": kind} if kind not in ("enum", "union") else {}
        if kind == "enum":
            prop["enum"] = ["a", "b c", 1, None][: rng.randint(1, 4)]
        if kind == "union":
            prop["anyOf"] = [{"type": "string"}, {"type": "null"}]
        if kind == "array":
            prop["items"] = {"type": "object", "properties": {"k": {"type": "string"}}, "required": ["k"]}
        if kind == "object":
            prop["properties"] = {"inner-name": {"type": "integer"}, "x": {"type": ["string", "null"]}}
        if rng.random() < 0.5:
            prop["description"] = rng.choice(["plain", "two\nlines", "has */ end", "  padded  ", ""])
        if rng.random() < 0.3:
            prop["default"] = rng.choice([0, "d", [1, 2], {"a": True}, None])
        props[rng.choice([f"p{j}", f"p-{j}", f"{j}x", "class", f"p{j}"])] = prop
    return {"type": "object", "properties": props, "required": [k for k in props if rng.random() < 0.4]}


def catalog_tools(count: int = 400) -> list[dict[str, Any]]:
    """``count`` varied ``mcp`` tools over 7 servers (names that collide once made identifiers, dotted ones, every operation)."""
    rng = random.Random(8)
    names = ["create_issue", "createIssue", "create-issue", "list", "get.file", "files.read", "files.write", "delete", "class", "123start", "ünïcode", "a b"]
    tools = []
    for i in range(count):
        tools.append(
            {
                "source": "mcp",
                "owner": rng.choice(["github", "git-hub", "fs", "db", "Slack", "x.y", "memory"]),
                "name": f"{names[i % len(names)]}{i // len(names) or ''}",
                "description": rng.choice(["", "One line.", "First.\n\nSecond line.\n" * rng.randint(1, 3), "ends */ here"]),
                "parameters": _schema(rng, i),
                "operation": rng.choice(_OPERATIONS),
            }
        )
    return tools


def _decoded(mcp: dict[str, Any], files: list[dict[str, Any]]) -> dict[str, Any]:
    """Main's ``{mcp, apiFiles}`` from the guest data's ``(mcp, files)``: templates joined, JSON texts parsed."""

    def text(template: list[int]) -> str:
        return "".join(mcp["texts"][i] for i in template)

    def tool(item: dict[str, Any]) -> dict[str, Any]:
        return {**item, "parameters": json.loads(item["parameters"]), "defaults": [[name, json.loads(value)] for name, value in item["defaults"]]}

    servers = [
        {
            **server,
            "header": text(server["header"]),
            "tools": [tool(t) for t in server["tools"]],
            "selectors": {key: {"tools": chosen, "header": text(header)} for key, (chosen, header) in server["selectors"].items()},
        }
        for server in mcp["servers"]
    ]
    root = {**mcp["root"], "header": text(mcp["root"]["header"]), "servers": json.loads(mcp["root"]["servers"])}
    return {"mcp": {"root": root, "servers": servers}, "apiFiles": [{**f, "content": text(f["content"])} for f in files]}


def rendered(shared: bool) -> str:
    namespace = build_namespace(Catalog().register(catalog_tools()).entries)
    blocks: dict[str, str] | None = {} if shared else None
    mcp, files = namespace.guest_data(blocks)
    assert mcp is not None
    decoded = _decoded(mcp, files)
    assert decoded["apiFiles"] == namespace.api_files(blocks)  # the API files the host renders, from the same blocks
    return compact_json(decoded)


def test_the_namespace_is_byte_identical_to_mains() -> None:
    text = rendered(shared=True)
    assert '"selectors"' in text and "  namespace " in text  # the catalog exercises selectors and groups
    assert hashlib.sha256(text.encode()).hexdigest() == GOLDEN
    assert rendered(shared=False) == text
