"""One tenant's CPU-heavy request never freezes the others (issue 11 item 1).

Each case sends one hostile request to the real service (real Docker cells) and, while
it is processed, probes the service from another scope with trivial RPCs: every probe
must answer quickly. Before the fix the event loop ran source preparation (5 s per MB),
metaschema checks (17 s for a 1.7 MB schema) and backtracking patterns (``^(a+)+$``)
itself, and the probes waited seconds. The bound is loose (a loaded 2-core machine);
the rule the code keeps is 20 ms.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json as _json
import os
import sys
import time
from collections.abc import AsyncIterator, Awaitable
from typing import Any

import grpc
import pytest

from cellblock.client import CellblockClient, CellblockError, LimitOverrides, Scope, Tool
from cellblock.server.workers import cpu_pool
from cellblock.v1 import catalog_service_pb2 as pb
from cellblock.v1 import catalog_service_pb2_grpc as pb_grpc
from cellblock.v1 import common_pb2

pytestmark = pytest.mark.asyncio(loop_scope="session")

#: Slowest answer a probe may get while a hostile request runs (catches a frozen loop only).
PROBE_BOUND_S = 1.5


async def _probe_while(client: CellblockClient, probe_scope: Scope, work: Awaitable[Any]) -> tuple[Any, float, int]:
    """Runs ``work`` while probing; returns its result, the slowest probe in seconds, and the probe count."""
    await client.put_catalog(probe_scope, [Tool(source="host", owner="core", name="noop")])
    task = asyncio.ensure_future(work)
    worst, probes = 0.0, 0
    while not task.done():
        started = time.monotonic()
        await client.tool_surface(probe_scope, "anthropic/claude-opus-5")
        worst = max(worst, time.monotonic() - started)
        probes += 1
        await asyncio.sleep(0.02)
    try:
        result = task.result()
    except CellblockError as exc:
        result = exc
    return result, worst, probes


def _other(scope: Scope) -> Scope:
    return Scope(session_id=scope.session_id + "-probe", agent_run_id=scope.agent_run_id)


async def test_a_huge_program_fails_its_own_leg_and_the_loop_stays_free(client: CellblockClient, scope: Scope) -> None:
    # Just under the 1 MB program limit: about 5 s of preparation, which once froze every tenant.
    await client.put_catalog(scope, [Tool(source="host", owner="core", name="noop")])
    code = "a;" * (1000 * 512)
    result, worst, probes = await _probe_while(client, _other(scope), client.exec(scope, tool_call_id="huge", code=code, handlers={}))
    if result.status == "failed" and result.failure_phase == "input":
        assert result.error.startswith("source preparation took longer than its 5000 ms budget"), result.error
    else:  # prepared within its budget: the program itself runs (and ends) in its cell
        assert result.code in ("", "timeout", "internal_error"), result.raw_json
    assert probes >= 3 and worst < PROBE_BOUND_S, (probes, worst)


async def test_a_backtracking_pattern_cannot_freeze_the_loop(client: CellblockClient, scope: Scope) -> None:
    tool = Tool(source="host", owner="core", name="match", parameters={"type": "object", "properties": {"s": {"type": "string", "pattern": "^(a+)+$"}}})
    await client.put_catalog(scope, [tool])
    code = """
        const out = [];
        for (let n = 20; n < 40; n++) {
          try { await tools.callValue("host:core:match", {s: "a".repeat(n) + "!"}); out.push("called"); }
          catch (e) { out.push(e.code); }
        }
        return out;
    """
    result, worst, _ = await _probe_while(client, _other(scope), client.exec(scope, tool_call_id="regex", code=code, handlers={}))
    assert result.status == "completed" and result.value == ["input_contract"] * 20, result.raw_json
    assert worst < PROBE_BOUND_S, worst


async def test_unique_items_over_a_big_array_of_objects_cannot_freeze_the_loop(client: CellblockClient, scope: Scope) -> None:
    # jsonschema compares unsortable items (objects, arrays) pairwise, inside one keyword evaluation
    # that no budget check reached: 4,000 objects (50 KB of input) held the loop for 11 s.
    tool = Tool(source="host", owner="core", name="uniq", parameters={"type": "object", "properties": {"xs": {"type": "array", "uniqueItems": True}}})
    await client.put_catalog(scope, [tool])
    code = """
        const out = [];
        for (const xs of [Array.from({length: 4000}, (_, i) => ({a: i, b: [i, {c: true}]})),
                          [{a: 1, b: [true]}, {b: [true], a: 1}], [1, true], [[1, 0], [1, false]], [{a: 1}, {a: 1, b: null}]]) {
          try { out.push((await tools.callValue("host:core:uniq", {xs})).n); } catch (e) { out.push(e.code); }
        }
        return out;
    """

    async def uniq(tool_input: Any, call: Any) -> Any:
        return {"details": {"n": len(tool_input["xs"])}}

    result, worst, _ = await _probe_while(client, _other(scope), client.exec(scope, tool_call_id="uniq", code=code, handlers={"uniq": uniq}))
    assert result.status == "completed" and result.value == [4000, "input_contract", 2, 2, 2], result.raw_json
    assert worst < PROBE_BOUND_S, worst


async def test_patterns_outside_the_linear_engine_are_refused_at_registration(client: CellblockClient, scope: Scope) -> None:
    tool = Tool(source="host", owner="core", name="look", parameters={"type": "string", "pattern": "^(?=a)a+$"})
    with pytest.raises(CellblockError, match=r"pattern '\^\(\?=a\)a\+\$' is outside the linear-time engine \(RE2\): invalid perl operator: \(\?= \(lookahead and lookbehind need backtracking\)"):
        await client.put_catalog(scope, [tool])


def _wide_schema(properties: int) -> dict[str, Any]:
    return {"type": "object", "properties": {f"p{i}": {"type": "string", "description": "x" * 20, "minLength": 1} for i in range(properties)}}


async def test_a_huge_trusted_schema_is_checked_off_the_loop(client: CellblockClient, scope: Scope) -> None:
    # About 1.5 MB: its metaschema check took 17 s on the loop; now it runs in a worker process.
    schema = _wide_schema(20_000)
    put = client.put_catalog(scope, [Tool(source="host", owner="core", name="wide", parameters=schema)])
    result, worst, probes = await _probe_while(client, _other(scope), put)
    assert not isinstance(result, Exception) or "budget" in str(result), result
    assert probes >= 2 and worst < PROBE_BOUND_S, (probes, worst)


async def test_a_huge_untrusted_schema_does_not_slow_every_exec_of_its_scope(client: CellblockClient, scope: Scope) -> None:
    # An mcp schema of about 1.5 MB: its declarations are rendered once per registration, in a worker.
    await client.put_catalog(scope, [Tool(source="mcp", owner="big", name="wide", parameters=_wide_schema(20_000))])
    for n in range(3):
        started = time.monotonic()
        result, worst, _ = await _probe_while(client, _other(scope), client.exec(scope, tool_call_id=f"x{n}", code="return 1", handlers={}))
        assert result.status == "completed", result.raw_json
        assert worst < PROBE_BOUND_S and time.monotonic() - started < 10, worst


@pytest.mark.parametrize("source", [common_pb2.TOOL_SOURCE_HOST, common_pb2.TOOL_SOURCE_MCP])
@pytest.mark.parametrize("depth", [300, 100_000])
async def test_a_schema_nested_past_the_cap_is_refused_with_its_reason(service: Any, scope: Scope, source: int, depth: int) -> None:
    schema_json = '{"items":' * depth + "{}" + "}" * depth
    tool = pb.Tool(source=source, owner="core", name="deep", parameters_json=schema_json)
    request = pb.PutCatalogRequest(scope=common_pb2.Scope(session_id=scope.session_id, agent_run_id=scope.agent_run_id), tools=[tool])
    async with grpc.aio.insecure_channel(service.address) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await pb_grpc.CatalogServiceStub(channel).PutCatalog(request)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = raised.value.details() or ""
    assert details.startswith("tool 0"), details
    assert details.endswith(("parameters is not a valid JSON Schema: nesting is deeper than 128 levels", "parameters_json is nested too deeply (at most 128 levels)")), details


#: Longest loop hold (lateness capped by the loop thread's CPU time, see
#: cellblock.server.telemetry.LoopMonitor) one megabyte-sized request may cause. The rule is
#: 20 ms (SPEC §3.1 item 6); the bound adds a tolerance of 30 ms for this 2-core machine shared
#: with other jobs: the same copy of tens of MB costs 2-3 times its idle CPU time there (page
#: faults of fresh buffers, cache and memory-bandwidth contention), and the 5 ms ticker's own
#: turns count too. Measured at load 8-12 (one run each, worst of the cases): 2-31 ms: a 21 MB
#: trusted PutCatalog 9-37 ms (main: 118-142 ms, the answer's entries built and serialized on the
#: loop and the tools' texts copied there; 453 ms in the issue), a 5 MB description 2-7 ms (16 ms:
#: echoed into the answer on the loop), a 40 MB tool surface 3-19 ms (40-43 ms: its 40 MB joined on
#: the loop), a search over 4 MB of descriptions 7-24 ms (25-50 ms: its registration built the
#: answer on the loop), a dense parked run listed and resumed 14-26 ms (30-43 ms: its document
#: concatenated and its view copied on the loop), an exec in a scope whose Start is 30 MB 1-16 ms
#: (18-25 ms: the Start concatenated on the loop). Any step of that kind coming back (a catalog
#: decoded, serialized or concatenated on the loop per request, a full collection of the start-up
#: heap) costs 40 ms and more on this machine and fails here. Unknown tool ids of 1 MB, 100 KB and 514
#: characters in a scope of 3,000 tools, and a 6,000-character search (``unknown_ids``): 11-13 ms at
#: load 7 (before: 4942 ms, each id's suggestions scored against every entry on the loop). The unit tests in
#: tests/unit/api/test_prepared_views.py pin the mechanisms themselves.
LOOP_HOLD_BOUND_S = 0.05
#: The 21 MB trusted PutCatalog keeps gRPC's own receive, decode and answer copies on the loop
#: (5-20 ms each, SPEC §3.1 item 6's known gaps): 35-48 ms at load 8-30, so its bound is wider.
#: Its old path (118-142 ms on this machine) still fails it.
#: A final value of 7-11 MB (``final_dense`` read whole, ``final_truncated`` over a 10 MiB budget)
#: still crosses gRPC twice on the loop (the cell's end received and decoded, the result sent):
#: 23-103 ms and 37-54 ms at load 8-14 (main: 530-1670 ms and 5455-5764 ms, the value parsed and
#: serialised twice on the loop, or its marker built and serialised there), so their bound is wider.
LOOP_HOLD_BOUNDS_S = {"put_host_huge": 0.08, "final_dense": 0.12, "final_truncated": 0.12, "tool_result_huge": 0.25}
#: 3,000 host tools of 5.3 KB (16 MB, ``put_host_many``) and one 22 MB schema of 140,000 properties
#: (``put_host_dense``) hold the loop thread 11-36 ms (load 4-6), within the common bound; counting every
#: thread's CPU time (``LoopMonitor.worst_process_s``) they hold it 49-68 ms and 109-158 ms: the pool's
#: thread unpickles their decoded tools holding Python's lock (SPEC §3.1 item 6's known gaps, not bounded here).
#: ``tool_result_huge``, a 59 MB ToolResult the guest reads, is a known gap too: 174-243 ms before,
#: 111-133 ms at load 5-13 after (decoded in a turn of its own, its text read once, its Settle written
#: in place); each remaining turn copies the 59 MB once or twice in gRPC or protobuf.

_LOOP_CASES = [
    "put_host", "put_mcp", "put_host_huge", "put_description", "exec_only", "exec_many_mcp", "describe", "tool_input", "tool_output",
    "search", "unknown_ids", "output", "park", "dense_input", "dense_output", "surface", "park_dense", "final_dense", "final_truncated",
    "put_host_many", "put_host_dense", "tool_result_huge",
]  # fmt: skip


#: Cases whose scope's catalog a first case registers, outside the measurement.
_REGISTERED_FIRST = {"exec_only": "put_mcp", "surface": "surface_put", "unknown_ids": "unknown_ids_put"}


@pytest.mark.parametrize("case", _LOOP_CASES)
async def test_a_megabyte_request_holds_the_loop_briefly(service: Any, client: CellblockClient, case: str) -> None:
    # The request is built and sent by another process, so the monitor counts the service's work only.
    session = f"loop-{os.getpid()}-{case}"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(["proto", "server", "client", "."])}

    async def child(name: str, scope_session: str) -> dict[str, Any]:
        proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "tests.support.loop_rows", service.address, name, scope_session, env=env, stdout=asyncio.subprocess.PIPE)
        out, _ = await asyncio.wait_for(proc.communicate(), timeout=300)
        assert proc.returncode == 0, out
        return dict(_json.loads(out.decode().strip().splitlines()[-1]))

    if case in _REGISTERED_FIRST:  # the scope's big catalog is registered first, outside the measurement
        assert (await child(_REGISTERED_FIRST[case], session))["ok"]
    monitor = service.loop_monitor
    monitor.reset()
    assert (await child("small", session + "-small"))["ok"]  # the baseline: same steps with kilobytes, same moment
    baseline = monitor.worst_s
    monitor.reset()
    answer = await child(case, session)
    worst = monitor.worst_s
    for name in (session, session + "-small"):
        await client.delete_catalog(Scope(session_id=name, agent_run_id="loop"))
    assert answer["ok"], answer
    assert monitor.ticks > 10, monitor.ticks  # the monitor ran meanwhile
    assert worst < LOOP_HOLD_BOUNDS_S.get(case, LOOP_HOLD_BOUND_S), f"{case}: the loop was held {worst * 1000:.0f} ms at once (wall lateness {monitor.worst_lateness_s * 1000:.0f} ms, counting every thread {monitor.worst_process_s * 1000:.0f} ms, baseline {baseline * 1000:.0f} ms)"


async def test_the_service_froze_its_start_up_heap_for_the_garbage_collector(service: Any) -> None:
    # A full collection of the start-up heap (about 135,000 objects) held the loop 80-120 ms.
    assert gc.get_freeze_count() > 50_000, gc.get_freeze_count()


async def test_a_new_catalog_version_reaches_the_next_leg_never_the_old_one(client: CellblockClient, scope: Scope) -> None:
    # Start bytes, describe texts and the search model are built once per catalog version:
    # each replace or merge must reach the next leg's cell, never a cached older version.
    code = """
        const d = await tools.describe(ALL_TOOLS[0].id);
        const hits = await tools.search("zebra");
        return {ids: ALL_TOOLS.map((t) => t.id), props: Object.keys(d.parameters.properties ?? {}), hits: hits.map((h) => h.id),
                mcp: typeof MCP === "undefined" ? [] : Object.keys(MCP).flatMap((s) => Object.keys(MCP[s]))};
    """

    def tool(name: str, prop: str, description: str = "") -> Tool:
        return Tool(source="host", owner="core", name=name, description=description, parameters={"type": "object", "properties": {prop: {"type": "string"}}})

    async def seen(n: int) -> dict[str, Any]:
        result = await client.exec(scope, tool_call_id=f"v{n}", code=code, handlers={})
        assert result.status == "completed", result.raw_json
        return dict(result.value)

    await client.put_catalog(scope, [tool("a", "first", "zebra crossing"), Tool(source="mcp", owner="old", name="gone")])
    assert await seen(1) == {"ids": ["host:core:a"], "props": ["first"], "hits": ["host:core:a"], "mcp": ["gone"]}
    await client.put_catalog(scope, [tool("a", "second"), Tool(source="mcp", owner="new", name="fresh")])
    assert await seen(2) == {"ids": ["host:core:a"], "props": ["second"], "hits": [], "mcp": ["fresh"]}
    await client.put_catalog(scope, [tool("b", "third", "zebra")], mode="merge")
    assert await seen(3) == {"ids": ["host:core:a", "host:core:b"], "props": ["second"], "hits": ["host:core:b"], "mcp": ["fresh"]}


async def test_the_tool_surface_is_each_catalog_versions_own(client: CellblockClient, scope: Scope) -> None:
    # GetToolSurface answers with a response serialized once per catalog version and engagement:
    # the next registration's surface is never the kept one.
    schema = {"type": "object", "properties": {"q": {"type": "string"}}}

    async def names() -> tuple[bool, list[str], list[Any]]:
        surface = await client.tool_surface(scope, "anthropic/claude-opus-5")
        return surface.code_mode_engaged, [t.name for t in surface.tools], [t.parameters for t in surface.tools]

    await client.put_catalog(scope, [Tool(source="host", owner="core", name="a"), Tool(source="client", owner="app", name="d", direct_only=True, parameters=schema)])
    first = await names()
    assert first[:2] == (True, ["exec", "wait", "d"]) and first[2][2] == schema
    assert await names() == first
    await client.put_catalog(scope, [Tool(source="client", owner="app", name="e", direct_only=True)])
    assert (await names())[:2] == (False, ["e"])
    await client.put_catalog(scope, [Tool(source="host", owner="core", name="b")], mode="merge")
    assert (await names())[:2] == (True, ["exec", "wait", "e"])


async def test_long_tool_inputs_and_results_keep_every_check(client: CellblockClient, scope: Scope) -> None:
    # Arguments and results over 64 KiB are read and checked in a worker process (SPEC §3.1 item 6):
    # the input contract (B10), the nesting bound (B23), the output contract (B08) and both
    # envelopes must answer exactly as they do for short ones.
    strict = {"type": "object", "properties": {"k": {"type": "string"}, "xs": {"type": "array"}}, "required": ["k"]}
    await client.put_catalog(
        scope,
        [
            Tool(source="host", owner="core", name="strict", parameters=strict),
            Tool(source="host", owner="core", name="free"),
            Tool(source="host", owner="core", name="rows", output_schema={"type": "object", "required": ["n"]}),
        ],
    )
    code = """
        const pad = "p".repeat(70000);
        const out = [];
        const attempt = async (f) => { try { out.push(await f()); } catch (e) { out.push(e.code || e.message.slice(0, 60)); } };
        await attempt(() => tools.callValue("host:core:strict", {xs: [pad]}));
        await attempt(async () => (await tools.callValue("host:core:strict", {k: "v", xs: [pad]})).n);
        let deep = [pad]; for (let i = 0; i < 3000; i++) deep = [deep];
        await attempt(() => tools.callValue("host:core:free", {deep}));
        await attempt(() => tools.callValue("host:core:rows", {}));
        await attempt(async () => { const r = await tools.call("host:core:free", {k: pad}); return [r.tool.id, r.result.details.n]; });
        return out;
    """
    pad = "p" * 70000

    async def sized(tool_input: Any, _call: Any) -> Any:
        return {"details": {"n": len(_json.dumps(tool_input))}}

    async def rows(_input: Any, _call: Any) -> Any:
        return {"details": {"wrong": pad}}

    handlers = {"host:core:strict": sized, "host:core:free": sized, "host:core:rows": rows}
    result = await client.exec(scope, tool_call_id="long", code=code, handlers=handlers)
    assert result.status == "completed", result.raw_json
    value = result.value
    assert value[0] == "input_contract" and value[1] == len(_json.dumps({"k": "v", "xs": [pad]})), value
    assert value[2].startswith("this callValue request is nested too deeply"), value[2]
    assert value[3].startswith('Tool "host:core:rows" returned details that do not match'), value[3]
    assert value[4] == ["host:core:free", len(_json.dumps({"k": pad}))], value[4]


@contextlib.asynccontextmanager
async def _busy_workers() -> AsyncIterator[None]:
    """Keeps every worker of the pool's large lane busy (a minute's sleep each) until the block ends."""
    pool = cpu_pool()
    busy = [asyncio.ensure_future(pool.run(time.sleep, 60, budget_s=60, size=10**6)) for _ in range(pool.workers)]
    try:
        yield
    finally:
        for job in busy:
            job.cancel()  # stops the sleeping workers
        await asyncio.gather(*busy, return_exceptions=True)


async def test_a_cancel_ends_a_leg_while_its_long_request_waits_for_a_worker(client: CellblockClient, scope: Scope) -> None:
    # A long request is read in a worker within the leg's deadline (up to 30 s). A CancelRun
    # meanwhile must end the leg now: it waited for the read before (here, for the busy workers).
    await client.put_catalog(scope, [Tool(source="host", owner="core", name="ready"), Tool(source="host", owner="core", name="echo")])
    ready = asyncio.Event()

    async def on_ready(_input: Any, _call: Any) -> Any:
        ready.set()
        return {"details": 1}

    code = 'await tools.callValue("host:core:ready", {}); return (await tools.callValue("host:core:echo", {s: "y".repeat(100000)}));'
    async with _busy_workers():
        leg = asyncio.ensure_future(client.exec(scope, tool_call_id="cancel-long", code=code, handlers={"host:core:ready": on_ready}, limits=LimitOverrides(timeout_ms=20000)))
        await asyncio.wait_for(ready.wait(), timeout=60)
        run_id = (await client.list_runs(scope)).runs[0].run_id
        await asyncio.sleep(1.0)  # the long request reaches the host and waits for a worker
        started = time.monotonic()
        assert await client.cancel_run(scope, run_id) == "running"
        result = await asyncio.wait_for(leg, timeout=60)
        took = time.monotonic() - started
    assert (result.status, result.code) == ("failed", "aborted"), result.raw_json
    assert took < 6.0, f"the cancel took {took:.1f} s"  # about 19 s (the rest of the leg's deadline) before


async def test_a_cancel_does_not_wait_for_a_long_result_being_read(client: CellblockClient, scope: Scope, service: Any) -> None:
    # A tool result over 64 KiB is read in a worker before it reaches the leg; a Cancel the runtime
    # sends after it waited behind that read (the stream's messages are read in order).
    await client.put_catalog(scope, [Tool(source="host", owner="core", name="rows")])
    called = asyncio.Event()

    async def rows(_input: Any, _call: Any) -> Any:
        called.set()
        return {"details": "r" * 100_000}

    def active() -> bool:
        return any(leg_scope == (scope.session_id, scope.agent_run_id) for leg_scope, _, _ in service.state.active_legs.values())

    async with _busy_workers():
        leg = asyncio.ensure_future(client.exec(scope, tool_call_id="cancel-result", code='return (await tools.callValue("host:core:rows", {})).length;', handlers={"host:core:rows": rows}, limits=LimitOverrides(timeout_ms=20000)))
        await asyncio.wait_for(called.wait(), timeout=60)
        await asyncio.sleep(1.0)  # the result reaches the service and waits for a worker
        started = time.monotonic()
        leg.cancel()  # the client sends Cancel
        while active() and time.monotonic() - started < 30:
            await asyncio.sleep(0.05)
        took = time.monotonic() - started
    # 0.1 s measured; before, the leg waited behind the read until this client's drain cut the
    # transport 5 s after its Cancel (a runtime that keeps its stream open waited the leg's deadline).
    assert not active() and took < 3.0, f"the leg ended {took:.1f} s after the cancel"
