"""Large requests sent to a service from a separate process (issue 11 item 1, loop holds).

The service's loop monitor (``Service.loop_monitor``) measures how long its event loop is
held; building and sending a request of megabytes in the same process would count the
client's own work, so the test runs each case here, in a child process::

    python -m tests.support.loop_rows ADDRESS CASE SESSION

Each case prints one JSON line with what it got back (the test checks it succeeded).
``small`` is the baseline: the same steps with kilobytes.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from cellblock.client import CellblockClient, LimitOverrides, Scope, Tool
from tests.support.big_catalog import big_mcp_registrations

#: Properties of the wide schema: about 3.5 MB of JSON at 25,000.
WIDE = 25_000
#: Properties of the huge trusted schema, and their description length: about 21 MB of JSON (few
#: nodes, long texts: its metaschema check in the worker stays well inside the registration budget
#: on a loaded machine, while the loop would copy all 21 MB).
HUGE, HUGE_DESCRIPTION = 2_000, 10_500
#: Characters of the long description.
DESCRIPTION_CHARS = 5 * 1024 * 1024


def wide_schema(properties: int) -> dict[str, Any]:
    """An object schema with ``properties`` string properties of 100-character descriptions."""
    return {"type": "object", "properties": {f"p{i}": {"type": "string", "description": "x" * 100, "minLength": 1} for i in range(properties)}}


def huge_schema() -> dict[str, Any]:
    """An object schema of about 21 MB: :data:`HUGE` string properties of :data:`HUGE_DESCRIPTION`-character descriptions."""
    return {"type": "object", "properties": {f"p{i}": {"type": "string", "description": "x" * HUGE_DESCRIPTION} for i in range(HUGE)}}


async def _echo(tool_input: dict[str, Any], _info: Any) -> dict[str, Any]:
    return {"n": len(json.dumps(tool_input))}


#: Rows of the huge tool result (about 59 MB of JSON, under the service message cap of 64 MiB).
HUGE_RESULT_ROWS = 550_000


def _big_output(chars: int) -> Any:
    async def handler(_input: dict[str, Any], _info: Any) -> dict[str, Any]:
        return {"rows": [{"i": i, "s": "w" * 90} for i in range(chars // 100)]}

    return handler


async def _exec(client: CellblockClient, scope: Scope, **kwargs: Any) -> Any:
    """``client.exec``, again (up to twice) when no cell was ready in time on a loaded machine ([R21])."""
    for _ in range(2):
        result = await client.exec(scope, **kwargs)
        if not (result.status == "failed" and result.code == "runtime_unavailable" and "busy" in (result.error or "")):
            return result
    return await client.exec(scope, **kwargs)


#: A dense JSON document of about 7 MB (200,000 small objects with a float each): the C decoder and
#: encoder, and the float fix-up of compact JSON, are slowest on this shape.
DENSE_ROWS = 200_000
DENSE_JS = "Array.from({length: %d}, (_, i) => ({i, f: i + 0.5, b: true}))"
#: 100 schemas of about 390 KB (2,600 properties each) for the tool surface.
SURFACE_TOOLS, SURFACE_PROPS = 100, 2_600
OBJECT = {"type": "object"}


def _dense_rows(rows: int) -> Any:
    async def handler(_input: dict[str, Any], _info: Any) -> dict[str, Any]:
        return {"details": {"rows": [{"i": i, "f": i + 0.5, "b": True} for i in range(rows)]}}

    return handler


def many_tools(count: int, description_chars: int) -> list[Tool]:
    """``count`` host tools whose descriptions all match the query ``"alpha"``."""
    return [Tool(source="host", owner="core", name=f"t{i}", description="alpha " + "d" * description_chars, parameters=wide_schema(5)) for i in range(count)]


_DENSE_CASES = ("put_mcp", "surface_put", "dense_input", "dense_output", "surface", "park_dense", "final_dense", "final_truncated")
#: Rows of the dense final value over a 10 MiB ``maxOutputBytes`` (about 11 MB, under the bridge bound of 11 MiB: truncated from its text).
OVER_ROWS = 320_000
#: The largest output budget (``maxOutputBytes``' top): a final value near the host's bridge bound fits it.
MOST_OUTPUT = LimitOverrides(memory_limit_bytes=512 * 1024 * 1024, timeout_ms=20000, max_output_bytes=10 * 1024 * 1024)


async def _final_case(client: CellblockClient, scope: Scope, case: str) -> dict[str, Any]:
    """A final value of megabytes: read once and returned whole (``final_dense``), or truncated from its text (``final_truncated``)."""
    await client.put_catalog(scope, [Tool(source="host", owner="core", name="noop")])
    rows = DENSE_ROWS if case == "final_dense" else OVER_ROWS
    result = await _exec(client, scope, tool_call_id="fv", code=f"return {DENSE_JS % rows};", handlers={}, limits=MOST_OUTPUT)
    value = result.value
    whole = isinstance(value, list) and len(value) == rows and value[-1] == {"i": rows - 1, "f": rows - 0.5, "b": True}
    marked = isinstance(value, dict) and value.get("truncated") is True and value["prefix"].startswith('[{"i":0,')
    return {"ok": whole if case == "final_dense" else marked, "status": result.status, "error": result.error[:300] if result.error else "", "value": str(value)[:300]}


async def _dense_case(client: CellblockClient, scope: Scope, case: str, props: int, big: LimitOverrides) -> dict[str, Any]:
    """The cases of big mcp catalogs, dense JSON, big tool surfaces and parked runs of a dense catalog (see :func:`run_case`)."""
    if case in ("final_dense", "final_truncated"):
        return await _final_case(client, scope, case)
    if case == "put_mcp":
        await client.put_catalog(scope, [Tool(source="mcp", owner="big", name="wide", parameters=wide_schema(props))])
        return {"ok": True}
    if case == "surface_put":
        tools = [Tool(source="client", owner="app", name=f"s{i}", direct_only=True, parameters=wide_schema(SURFACE_PROPS)) for i in range(SURFACE_TOOLS)]
        await client.put_catalog(scope, tools)
        return {"ok": True}
    if case == "dense_input":  # checked against a schema, so the input contract runs too
        await client.put_catalog(scope, [Tool(source="host", owner="core", name="echo", parameters=OBJECT)])
        code = f'return (await tools.callValue("host:core:echo", {{xs: {DENSE_JS % DENSE_ROWS}}})).n;'
        result = await _exec(client, scope, tool_call_id="di", code=code, handlers={"host:core:echo": _echo}, limits=big)
    elif case == "dense_output":  # with an outputSchema, so the output contract runs too
        await client.put_catalog(scope, [Tool(source="host", owner="core", name="rows", output_schema=OBJECT)])
        code = "return (await tools.callValue('host:core:rows', {})).rows.length;"
        result = await _exec(client, scope, tool_call_id="do", code=code, handlers={"host:core:rows": _dense_rows(DENSE_ROWS)}, limits=big)
    elif case == "surface":  # the scope was registered before (surface_put): only the surface is measured
        for model in ("", "anthropic/claude-opus-5", ""):
            surface = await client.tool_surface(scope, model)
        return {"ok": len(surface.tools) >= SURFACE_TOOLS, "tools": len(surface.tools)}
    elif case == "park_dense":  # a run parks in a scope with a dense mcp catalog; ListRuns and Wait read it
        await client.put_catalog(scope, [Tool(source="mcp", owner="big", name="wide", parameters=wide_schema(props))])
        first = await _exec(client, scope, tool_call_id="pd", code='return await yield_control("x");', handlers={}, limits=big)
        if first.status != "waiting":
            return {"ok": False, "status": first.status, "error": first.error[:300] if first.error else ""}
        for _ in range(3):
            listed = await client.list_runs(scope)
        result = await client.wait(scope, tool_call_id="pd2", run_id=first.run_id, handlers={})
        if len(listed.runs) != 1:
            return {"ok": False, "listed": len(listed.runs)}
    else:
        raise SystemExit(f"unknown case {case}")
    return {"ok": result.status == "completed", "status": result.status, "error": result.error[:300] if result.error else ""}


_PUT_CASES = ("put_host", "small", "put_host_huge", "put_description", "put_host_dense", "put_host_many")
#: Tools of the many-tools registration and the properties of each one's schema: 3,000 tools of about 5.3 KB (16 MB).
MANY_HOST, MANY_HOST_PROPS = 3_000, 34
#: Properties of the dense huge trusted schema: about 22 MB of JSON in many small nodes.
DENSE_HOST = 140_000


async def _put_case(client: CellblockClient, scope: Scope, case: str, props: int) -> dict[str, Any]:
    """The registrations alone: a wide trusted schema (``small``: 20 properties), a 21 MB one, a 5 MB description."""
    if case == "put_host_many":
        tools = [Tool(source="host", owner="core", name=f"t{i}", description=f"Tool {i}.", parameters=wide_schema(MANY_HOST_PROPS)) for i in range(MANY_HOST)]
        catalog = await client.put_catalog(scope, tools)
        return {"ok": len(catalog.entries) == MANY_HOST and catalog.entries[-1].tool.parameters == tools[-1].parameters}
    if case == "put_host_huge":
        tool = Tool(source="host", owner="core", name="wide", parameters=huge_schema())
    elif case == "put_host_dense":
        tool = Tool(source="host", owner="core", name="wide", parameters=wide_schema(DENSE_HOST))
    elif case == "put_description":
        tool = Tool(source="host", owner="core", name="long", description="d" * DESCRIPTION_CHARS)
    else:
        tool = Tool(source="host", owner="core", name="wide", parameters=wide_schema(props))
    catalog = await client.put_catalog(scope, [tool])
    # The answer lists the registered entry with its texts as they were registered.
    (entry,) = catalog.entries
    return {"ok": entry.tool.description == tool.description and (entry.tool.parameters == tool.parameters)}


def _exec_catalog(case: str, props: int) -> tuple[list[Tool], int | None]:
    """The catalog an ``exec_*`` case registers first, and its exec's memory limit (``None``: the default 64 MiB).

    ``exec_big_mcp``: one mcp tool of a wide schema; ``exec_only``: none (registered before);
    ``exec_many_mcp``: 1500 mcp tools of 2.6 KB schemas (:mod:`tests.support.big_catalog`).
    """
    if case == "exec_many_mcp":
        return [Tool(**t) for t in big_mcp_registrations()], None
    tools = [Tool(source="mcp", owner="big", name="wide", parameters=wide_schema(props))] if case == "exec_big_mcp" else []
    return tools, 512 * 1024 * 1024


#: Tools of the scope the unknown ids are looked up in, and the ids' lengths (1 MB, 100 KB, and one just
#: under the longest id a catalog can hold, which is scored for suggestions).
UNKNOWN_ID_TOOLS = 3_000
UNKNOWN_ID_TEXTS = ('"q".repeat(1000000)', '"read ".repeat(20000)', '"t1_x" + "z".repeat(510)')
#: What the guest sees: [B07] three times, then [B28] for a query of 6,000 characters.
UNKNOWN_IDS_ANSWER = ["B07", "B07", "B07 t1", "B28"]


async def _unknown_ids_case(client: CellblockClient, scope: Scope, case: str, _props: int) -> dict[str, Any]:
    """Looks up unknown id texts of 1 MB, 100 KB and 514 characters in the scope's 3,000 tools, then searches 6,000 characters.

    ``unknown_ids_put`` registers the tools (before the measurement: a 3,000-tool registration is a case of its own).
    """
    if case == "unknown_ids_put":
        await client.put_catalog(scope, many_tools(UNKNOWN_ID_TOOLS, 100))
        return {"ok": True}
    code = f"""
        const out = [];
        for (const text of [{", ".join(UNKNOWN_ID_TEXTS)}]) {{
          try {{ await tools.callValue(text, {{}}); out.push("called"); }}
          catch (e) {{ out.push(e.message.length < 2000 && e.message.startsWith("Unknown tool: ") ? (e.message.includes("Did you mean: t1") ? "B07 t1" : "B07") : e.message.slice(0, 300)); }}
        }}
        try {{ await tools.search("alpha ".repeat(1000)); out.push("searched"); }}
        catch (e) {{ out.push(e.message.startsWith("tools.search query is longer than 4096 characters") ? "B28" : e.message.slice(0, 300)); }}
        return out;
    """
    result = await _exec(client, scope, tool_call_id="u", code=code, handlers={}, limits=LimitOverrides(timeout_ms=20000))
    return {"ok": result.status == "completed" and result.value == UNKNOWN_IDS_ANSWER, "status": result.status, "value": str(result.value)[:300], "error": result.error[:300] if result.error else ""}


async def _huge_result_case(client: CellblockClient, scope: Scope, _case: str, _props: int) -> dict[str, Any]:
    """The runtime answers a tool call with about 59 MB of JSON (:data:`HUGE_RESULT_ROWS` rows), which the guest reads whole."""
    await client.put_catalog(scope, [Tool(source="host", owner="core", name="rows")])
    code = "return (await tools.callValue('host:core:rows', {})).rows.length;"
    limits = LimitOverrides(memory_limit_bytes=1024 * 1024 * 1024, max_snapshot_bytes=128 * 1024 * 1024, timeout_ms=60000)
    result = await _exec(client, scope, tool_call_id="rh", code=code, handlers={"host:core:rows": _big_output(HUGE_RESULT_ROWS * 100)}, limits=limits)
    return {"ok": result.status == "completed" and result.value == HUGE_RESULT_ROWS, "status": result.status, "value": str(result.value)[:100], "error": result.error[:300] if result.error else ""}


#: Cases answered by a function of their own: ``(client, scope, case, props) -> summary``.
_OWN_CASES: dict[str, Callable[[CellblockClient, Scope, str, int], Awaitable[dict[str, Any]]]] = {
    **dict.fromkeys(_PUT_CASES, _put_case),
    "unknown_ids_put": _unknown_ids_case,
    "unknown_ids": _unknown_ids_case,
    "tool_result_huge": _huge_result_case,
}


async def run_case(address: str, case: str, session: str) -> dict[str, Any]:
    """Runs one case against the service at ``address``; returns a summary of its answer."""
    scope = Scope(session_id=session, agent_run_id="loop")
    small = case == "small"
    props = 20 if small else WIDE
    chars = 2_000 if small else 2_300_000
    big = LimitOverrides(memory_limit_bytes=512 * 1024 * 1024, timeout_ms=20000)
    async with await CellblockClient.connect(address) as client:
        if case in _DENSE_CASES:
            return await _dense_case(client, scope, case, props, big)
        own = _OWN_CASES.get(case)
        if own is not None:
            return await own(client, scope, case, props)
        if case == "describe":
            await client.put_catalog(scope, [Tool(source="host", owner="core", name="wide", parameters=wide_schema(props))])
            result = await _exec(client, scope, tool_call_id="d", code='const d = await tools.describe("host:core:wide"); return JSON.stringify(d).length;', handlers={})
        elif case == "tool_input":
            await client.put_catalog(scope, [Tool(source="host", owner="core", name="echo")])
            code = f'return (await tools.callValue("host:core:echo", {{s: "y".repeat({chars})}})).n;'
            result = await _exec(client, scope, tool_call_id="t", code=code, handlers={"host:core:echo": _echo}, limits=LimitOverrides(timeout_ms=20000))
        elif case in ("exec_big_mcp", "exec_only", "exec_many_mcp"):
            tools, memory = _exec_catalog(case, props)
            if tools:  # exec_only: the scope's catalog is already the big mcp one (put_mcp before)
                await client.put_catalog(scope, tools)
            result = await _exec(client, scope, tool_call_id="m", code="return (await API.list()).files.length", handlers={}, limits=LimitOverrides(memory_limit_bytes=memory, timeout_ms=20000))
        elif case == "tool_output":
            await client.put_catalog(scope, [Tool(source="host", owner="core", name="rows")])
            code = "return (await tools.callValue('host:core:rows', {})).rows.length;"
            result = await _exec(client, scope, tool_call_id="r", code=code, handlers={"host:core:rows": _big_output(chars)}, limits=LimitOverrides(timeout_ms=20000))
        elif case == "search":
            await client.put_catalog(scope, many_tools(20 if small else 500, 100 if small else 8000))
            code = 'const hits = await tools.search("alpha", {limit: 50}); return hits.length;'
            result = await _exec(client, scope, tool_call_id="s", code=code, handlers={}, limits=LimitOverrides(timeout_ms=20000))
        elif case == "park":  # a run parks and resumes in a scope with a large mcp catalog (a 7 MB view)
            await client.put_catalog(scope, [Tool(source="mcp", owner="big", name="wide", parameters=wide_schema(props // 5))])
            limits = LimitOverrides(memory_limit_bytes=512 * 1024 * 1024, timeout_ms=20000)
            first = await _exec(client, scope, tool_call_id="p", code='return await yield_control("x");', handlers={}, limits=limits)
            if first.status != "waiting":
                return {"ok": False, "status": first.status, "error": first.error[:300] if first.error else ""}
            result = await client.wait(scope, tool_call_id="p2", run_id=first.run_id, handlers={})
        elif case == "output":
            await client.put_catalog(scope, [Tool(source="host", owner="core", name="noop")])
            code = 'for (let i = 0; i < 200; i++) console.log("z".repeat(40000)); return [..."v".repeat(2000)];'
            result = await _exec(client, scope, tool_call_id="o", code=code, handlers={}, limits=LimitOverrides(max_output_bytes=10 * 1024 * 1024, timeout_ms=20000))
        else:
            raise SystemExit(f"unknown case {case}")
        return {"ok": result.status == "completed", "status": result.status, "error": result.error[:300] if result.error else ""}


if __name__ == "__main__":
    print(json.dumps(asyncio.run(run_case(sys.argv[1], sys.argv[2], sys.argv[3]))))
