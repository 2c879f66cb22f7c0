"""A catalog of 1500 MCP-like tools over 10 servers, about 2.6 KB of input schema each (issue 11).

Its guest catalog was a 37.7 MB ``Start`` the cell could not install at the default 64 MiB
memory limit; tests that a large ``mcp`` scope still runs build it here.
"""

from __future__ import annotations

import random
from typing import Any

__all__ = ["SERVERS", "TOOLS", "big_mcp_registrations"]

SERVERS, TOOLS, PROPS = 10, 1500, 12
_WORDS = ["repository", "owner", "issue", "label", "the", "filter", "page", "results", "state", "sort"]


def _schema(i: int) -> dict[str, Any]:
    """An MCP-like input schema of about 2.6 KB: :data:`PROPS` described properties (enums, arrays, objects, defaults)."""
    rnd = random.Random(i)
    props: dict[str, Any] = {}
    for k in range(PROPS):
        kind = rnd.choice(["string", "integer", "boolean", "enum", "array", "object"])
        prop: dict[str, Any] = {"description": f"The {k}th parameter of tool {i}: " + " ".join(rnd.choice(_WORDS) for _ in range(14))}
        if kind == "enum":
            prop.update(type="string", enum=["open", "closed", "all", "merged"], default="open")
        elif kind == "array":
            prop.update(type="array", items={"type": "string", "description": "One item."})
        elif kind == "object":
            prop.update(type="object", properties={"name": {"type": "string", "description": "A name."}, "value": {"type": "number"}}, required=["name"])
        else:
            prop.update(type=kind)
        props[f"param_{k}_{rnd.choice(['name', 'id', 'count', 'flag'])}"] = prop
    return {"type": "object", "properties": props, "required": list(props)[:2], "additionalProperties": False}


def big_mcp_registrations() -> list[dict[str, Any]]:
    """Registration dicts: :data:`TOOLS` ``mcp`` tools ``tool_action_<i>`` of ``server-<i % 10>``, then 5 ``host`` tools ``lookup_<k>``."""
    mcp = [
        {"source": "mcp", "owner": f"server-{i % SERVERS}", "name": f"tool_action_{i}", "description": f"Performs action {i} on the remote service. " * 3, "parameters": _schema(i)}
        for i in range(TOOLS)
    ]
    return [*mcp, *({"source": "host", "owner": "core", "name": f"lookup_{k}", "description": f"Looks up record kind {k} by id."} for k in range(5))]
