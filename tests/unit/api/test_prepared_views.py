"""What the loop serves a catalog version from is built off the loop, for that version only (SPEC §2.3).

Real worker processes (:class:`~cellblock.server.workers.CpuPool`) build a view's ``Start``
catalog part, its search model and its schema texts at registration; a run gets them only
with the exact view they were built for. These tests prove a stale catalog is never sent:
after a replace or a merge, a new run's ``Start`` bytes, ``tools.describe`` answer and
search ranking are the new version's, and a run that kept the old view keeps the old ones.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from cellblock.bridge.v1 import bridge_service_pb2 as bpb
from cellblock.server.api._catalogs import PreparedView, RunCatalog, ScopeCatalog, prepare_view
from cellblock.server.catalog import compact_json, registration_problem, tool_surface
from cellblock.server.config import CodeModeConfig
from cellblock.server.runs._start import start_message
from cellblock.server.workers import CpuPool

CONFIG = CodeModeConfig.from_json({})


@pytest.fixture(scope="module")
def cpu() -> Iterator[CpuPool]:
    pool = CpuPool(1)
    yield pool
    pool.close()


def _tool(name: str, description: str, prop: str) -> dict[str, Any]:
    schema = {"type": "object", "properties": {prop: {"type": "string", "description": f"the {prop}"}}}
    return {"source": "host", "owner": "core", "name": name, "description": description, "parameters_json": json.dumps(schema)}


async def _put(scope: ScopeCatalog, cpu: CpuPool, tools: list[dict[str, Any]], mode: str = "replace") -> None:
    """Registers like PutCatalog does: decode and check in a worker, register, prepare in a worker."""
    problem, texts, decoded = await cpu.run(registration_problem, tools, "replace", [], None, None, budget_s=30)
    assert problem is None, problem
    view = scope.catalog.register(decoded, mode=mode, check_schemas=False, copy=False)
    scope.schema_texts = {**scope.schema_texts, **texts} if mode == "merge" else texts
    scope.set_prepared(await prepare_view(view, scope.schema_texts, cpu, 0, ("s", "a")))


def _sent_catalog(run: RunCatalog) -> dict[str, Any]:
    """The guest catalog a leg of ``run`` sends, parsed from its Start bytes."""
    start = bpb.AttachResponse.FromString(start_message(run.start_catalog_part(), bpb.Start(run_id="r"))).start
    assert start.run_id == "r"
    return dict(json.loads(start.catalog_json))


@pytest.mark.asyncio
async def test_worker_built_start_part_is_the_views_guest_catalog(cpu: CpuPool) -> None:
    scope = ScopeCatalog(CONFIG)
    await _put(scope, cpu, [_tool("a", "alpha tool", "x"), {"source": "mcp", "owner": "gh", "name": "issue", "parameters_json": '{"type":"object"}'}])
    run = scope.view()
    unprepared = RunCatalog(scope.catalog.view, CONFIG)
    assert run.start_catalog_part() == unprepared.start_catalog_part()
    assert _sent_catalog(run) == json.loads(compact_json(unprepared.guest_catalog()))


@pytest.mark.asyncio
async def test_a_replaced_catalog_is_never_sent_stale(cpu: CpuPool) -> None:
    scope = ScopeCatalog(CONFIG)
    await _put(scope, cpu, [_tool("a", "alpha tool", "x")])
    old = scope.view()
    await _put(scope, cpu, [_tool("b", "beta tool", "y")])
    new = scope.view()
    assert [t["id"] for t in _sent_catalog(new)["allTools"]] == ["host:core:b"]
    assert json.loads(new.describe_json("b"))["parameters"]["properties"] == {"y": {"type": "string", "description": "the y"}}
    assert [e["id"] for e in new.search("beta", None)] == ["host:core:b"] and new.search("alpha", None) == []
    # The run that kept the old view keeps the old version (SPEC §3.2 item 6).
    assert [t["id"] for t in _sent_catalog(old)["allTools"]] == ["host:core:a"]
    assert json.loads(old.describe_json("a"))["parameters"]["properties"] == {"x": {"type": "string", "description": "the x"}}


@pytest.mark.asyncio
async def test_a_merge_sends_both_versions_entries_with_the_merged_schema(cpu: CpuPool) -> None:
    scope = ScopeCatalog(CONFIG)
    await _put(scope, cpu, [_tool("a", "alpha tool", "x"), _tool("b", "beta tool", "y")])
    await _put(scope, cpu, [_tool("a", "gamma tool", "z")], mode="merge")
    run = scope.view()
    assert [(t["id"], t["description"]) for t in _sent_catalog(run)["allTools"]] == [("host:core:a", "gamma tool"), ("host:core:b", "beta tool")]
    assert json.loads(run.describe_json("a"))["parameters"]["properties"] == {"z": {"type": "string", "description": "the z"}}
    assert [e["id"] for e in run.search("gamma", None)] == ["host:core:a"] and run.search("alpha", None) == []


@pytest.mark.asyncio
async def test_a_view_registered_after_the_prepared_one_gets_nothing_prepared(cpu: CpuPool) -> None:
    scope = ScopeCatalog(CONFIG)
    await _put(scope, cpu, [_tool("a", "alpha tool", "x")])
    stale = scope._prepared
    assert stale is not None
    # A merge whose preparation has not finished (or failed): the new view has nothing prepared,
    # so a run of it builds its own Start part from its own view instead of the stale one.
    scope.catalog.register([{"source": "host", "owner": "core", "name": "c"}], mode="merge")
    run = scope.view()
    assert [t["id"] for t in _sent_catalog(run)["allTools"]] == ["host:core:a", "host:core:c"]
    # A preparation finishing late for a view that is no longer current is dropped.
    scope.set_prepared(stale)
    assert scope._prepared is stale and scope.view().start_catalog_part() != stale.start_part


def test_a_run_refuses_prepared_data_of_another_view() -> None:
    scope = ScopeCatalog(CONFIG)
    first = scope.catalog.register([{"source": "host", "name": "a"}])
    scope.catalog.register([{"source": "host", "name": "b"}])
    prepared = PreparedView(first, RunCatalog(first, CONFIG).namespace, b"", {}, None, b"[]", 0)
    with pytest.raises(ValueError, match="another catalog view"):
        RunCatalog(scope.catalog.view, CONFIG, prepared)


@pytest.mark.asyncio
async def test_schema_texts_are_decoded_in_the_worker_with_the_documented_refusals(cpu: CpuPool) -> None:
    bad = {"source": "host", "name": "x", "parameters_json": "{nope"}
    problem, texts, tools = await cpu.run(registration_problem, [bad], "replace", [], None, None, budget_s=30)
    assert problem == (0, "parameters_json is not valid JSON", None) and texts == {} and tools == []
    deep = {"source": "mcp", "owner": "o", "name": "x", "output_schema_json": '{"a":' * 100_000 + "1" + "}" * 100_000}
    problem, _, _ = await cpu.run(registration_problem, [deep], "replace", [], None, None, budget_s=30)
    assert problem is not None and problem[1] == "output_schema_json is nested too deeply (at most 128 levels)"
    problem, texts, tools = await cpu.run(registration_problem, [_tool("a", "d", "x")], "replace", [], None, None, budget_s=30)
    assert problem is None and texts["host:core:a"][0] == '{"type":"object","properties":{"x":{"type":"string","description":"the x"}}}'
    assert "parameters_json" not in tools[0] and tools[0]["parameters"]["properties"]["x"]["description"] == "the x"


@pytest.mark.asyncio
async def test_a_parked_runs_catalog_document_from_the_worker_equals_the_views_own(cpu: CpuPool) -> None:
    scope = ScopeCatalog(CONFIG)
    await _put(scope, cpu, [_tool("a", "alpha ☃", "x"), {"source": "mcp", "owner": "gh", "name": "issue", "parameters_json": '{"type":"object","description":"lone \\ud800"}'}])
    run = scope.view()
    run.search("alpha", None)
    run.count_call()
    unprepared = RunCatalog(scope.catalog.view, CONFIG)
    stored = json.loads(b"".join(run.state_parts()).decode("utf-8", "surrogatepass"))
    assert stored.pop("catalogVersion") == scope._prepared.version  # type: ignore[union-attr]
    assert stored == json.loads(b"".join(unprepared.state_parts()).decode("utf-8", "surrogatepass")) == json.loads(json.dumps(run.to_state()))
    restored = RunCatalog.from_state(stored, CONFIG)
    assert restored.start_catalog_part() == run.start_catalog_part() and restored.counter_scope == run.counter_scope
    # A document an earlier host wrote (declarations written out, no ``mcp.texts``) gets this host's shape, from its view.
    old_shape = json.loads(json.dumps(stored))
    del old_shape["guestCatalog"]["mcp"]["texts"]
    assert RunCatalog.from_state(old_shape, CONFIG).start_catalog_part() == run.start_catalog_part()


@pytest.mark.asyncio
async def test_a_run_resumed_on_this_replica_gets_its_own_preparation_back_and_no_other(cpu: CpuPool) -> None:
    scope = ScopeCatalog(CONFIG)
    await _put(scope, cpu, [_tool("a", "alpha tool", "x")])
    parked = json.loads(b"".join(scope.view().state_parts()).decode("utf-8", "surrogatepass"))
    again = scope.restore_view(parked)
    assert again._prepared is scope._prepared and again.start_catalog_part() is scope._prepared.start_part
    # After a new registration the stored run is restored from its own document: the old version.
    await _put(scope, cpu, [_tool("b", "beta tool", "y")])
    old = scope.restore_view(parked)
    assert old._prepared is None and [t["id"] for t in _sent_catalog(old)["allTools"]] == ["host:core:a"]
    assert json.loads(old.describe_json("a"))["parameters"]["properties"] == {"x": {"type": "string", "description": "the x"}}


async def _put_with(scope: ScopeCatalog, cpu: CpuPool, tools: list[dict[str, Any]], direct: list[str], deny: list[str]) -> None:
    problem, texts, decoded = await cpu.run(registration_problem, tools, "replace", direct, None, deny, budget_s=30)
    assert problem is None, problem
    view = scope.catalog.register(decoded, direct_tool_names=direct, deny=deny, check_schemas=False, copy=False)
    scope.schema_texts = texts
    scope.set_prepared(await prepare_view(view, texts, cpu, 0, ("s", "a")))


@pytest.mark.asyncio
@pytest.mark.parametrize("engaged", [True, False])
async def test_the_tool_surface_comes_from_the_workers_schema_texts_per_version(cpu: CpuPool, engaged: bool) -> None:
    # GetToolSurface over 100 schemas of 390 KB held the loop 480 ms per call when it copied and
    # serialized them; it now answers from the registration's texts, built once per version.
    config = CodeModeConfig.from_json(engaged)
    tools = [
        _tool("a", "alpha tool", "x"),
        {**_tool("d", "direct only", "z"), "directOnly": True},
        _tool("gone", "denied", "q"),
        {"source": "mcp", "owner": "gh", "name": "issue", "parameters_json": '{"type":"object","properties":{"n":{"type":"number","minimum":1.5}}}'},
        {"source": "host", "owner": "core", "name": "bare"},
    ]
    scope = ScopeCatalog(config)
    await _put_with(scope, cpu, tools, ["a"], ["gone"])
    old_engaged, old_tools = tool_surface(scope.catalog, config, None)
    expected = [(t["name"], t.get("description", ""), compact_json(t.get("parameters", {}))) for t in old_tools]
    assert scope.tool_surface(config, None) == (old_engaged, expected) and old_engaged is engaged
    assert [name for name, *_ in expected] == (["exec", "wait", "a", "d"] if engaged else ["a", "d", "gone", "issue", "bare"])
    # The texts are the worker's, not serialized again here; the same version answers from its cache.
    fresh = ScopeCatalog(config)
    await _put_with(fresh, cpu, tools, ["a"], ["gone"])
    fresh.schema_texts = {key: ('{"from":"worker"}', out) for key, (_, out) in fresh.schema_texts.items()}
    surface = fresh.tool_surface(config, None)[1]
    assert all(params == '{"from":"worker"}' for name, _, params in surface if name not in ("exec", "wait", "bare")), surface
    assert fresh.tool_surface(config, None)[1] is surface
    # The next version is never answered from the old one's cache.
    await _put_with(fresh, cpu, [_tool("b", "beta", "y")], ["b"], [])
    assert [name for name, *_ in fresh.tool_surface(config, None)[1]] == (["exec", "wait", "b"] if engaged else ["b"])
