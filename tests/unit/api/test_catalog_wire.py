"""PutCatalog's one worker call and its answer put together from bytes (SPEC §3.1 item 6).

The worker reads the tools from the request's wire bytes and returns each entry's serialized
``CatalogEntry`` (and, for a new session, the view's start data); the answer is those bytes
concatenated. It must parse as exactly the message the loop used to build: same entries, same
order, same texts, the head's telemetry and direct names, entries merged from several
registrations, and entries without kept bytes written on the loop.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from cellblock.server.api._catalog_service import telemetry_message
from cellblock.server.api._catalog_wire import catalog_response, entry_message, register_in_worker
from cellblock.server.api._catalogs import PreparedView, ScopeCatalog, prepare_view
from cellblock.server.config import CodeModeConfig
from cellblock.server.workers import CpuPool
from cellblock.v1 import catalog_service_pb2 as pb
from cellblock.v1 import common_pb2

CONFIG = CodeModeConfig.from_json({})
SCOPE = ("s", "a")
HOSTED = [{"source": "mcp", "owner": "hub", "name": "ping", "description": "hosted"}]


@pytest.fixture(scope="module")
def cpu() -> Iterator[CpuPool]:
    pool = CpuPool(1)
    yield pool
    pool.close()


def _request(*tools: pb.Tool) -> bytes:
    return pb.PutCatalogRequest(scope=common_pb2.Scope(session_id=SCOPE[0], agent_run_id=SCOPE[1]), tools=list(tools)).SerializeToString()


def _host(name: str, description: str = "", **schema: Any) -> pb.Tool:
    return pb.Tool(source=common_pb2.TOOL_SOURCE_HOST, owner=" core ", name=name, description=description, parameters_json=json.dumps(schema) if schema else "", replay_safe=True)


async def _register(scope: ScopeCatalog, cpu: CpuPool, data: bytes, merge: bool, direct: list[str]) -> None:
    """What ``CatalogService._put`` does with the worker's answer."""
    fresh = not merge
    problem, texts, tools, wire, start = await cpu.run(register_in_worker, data, HOSTED, fresh, direct, None, None, budget_s=30)
    assert problem is None, problem
    view = scope.catalog.register(tools, mode="merge" if merge else "replace", direct_tool_names=direct, check_schemas=False, copy=False)
    scope.schema_texts = {**scope.schema_texts, **texts} if merge else texts
    scope.entry_wire = {**scope.entry_wire, **wire} if merge else wire
    if start is None:
        prepared = await prepare_view(view, scope.schema_texts, cpu, 0, SCOPE)
    else:
        namespace, part, model, entries_json, catalog_bytes = start
        prepared = PreparedView(view, namespace, part, scope.schema_texts, model, entries_json, catalog_bytes)
    scope.set_prepared(prepared)


def _expected(scope: ScopeCatalog) -> pb.Catalog:
    """The answer as the loop built it before: one message, every entry written here."""
    view = scope.catalog.view
    return pb.Catalog(
        scope=common_pb2.Scope(session_id=SCOPE[0], agent_run_id=SCOPE[1]),
        entries=[entry_message(e, None) for e in view.entries],
        telemetry=telemetry_message(scope.telemetry()),
        direct_tool_names=[t["name"] for t in view.direct_tools()],
    )


async def _answer(scope: ScopeCatalog) -> pb.Catalog:
    data = await catalog_response(SCOPE, scope, telemetry_message(scope.telemetry()))
    return pb.PutCatalogResponse.FromString(data).catalog


@pytest.mark.asyncio
async def test_the_answer_from_kept_bytes_is_the_message_the_loop_built(cpu: CpuPool) -> None:
    scope = ScopeCatalog(CONFIG)
    await _register(scope, cpu, _request(_host("b", "bee", type="object"), _host("a", "ay" * 700_000)), merge=False, direct=["b"])
    first = await _answer(scope)
    assert first == _expected(scope)
    assert [e.id for e in first.entries] == ["host:core:a", "host:core:b", "mcp:hub:ping"]  # sorted by id, the hosted entry too
    assert first.entries[0].tool.description == "ay" * 700_000 and first.direct_tool_names == ["b"]
    assert first.entries[1].tool.parameters_json == '{"type":"object"}' and first.entries[1].tool.owner == "core"
    # The new session's view data came from the same worker call as the answer's bytes.
    run = scope.view()
    assert sorted(t["id"] for t in run.guest_catalog()["allTools"]) == ["host:core:a", "host:core:b"]
    assert run.namespace.paths == {"hub.ping": "mcp:hub:ping"}
    # A merge keeps the earlier entries' bytes and adds the new ones'; its view is prepared by a second call.
    await _register(scope, cpu, _request(_host("c", "sea")), merge=True, direct=[])
    merged = await _answer(scope)
    assert merged == _expected(scope)
    assert [e.id for e in merged.entries] == ["host:core:a", "host:core:b", "host:core:c", "mcp:hub:ping"]
    # An entry whose bytes are not kept is written on the loop, the same way.
    del scope.entry_wire["host:core:a"]
    assert await _answer(scope) == merged
    # The merged view's data came from a second call: its guest catalog has the merged entry.
    assert sorted(t["id"] for t in scope.view().guest_catalog()["allTools"]) == ["host:core:a", "host:core:b", "host:core:c"]


@pytest.mark.asyncio
async def test_the_worker_refuses_what_the_loop_refused(cpu: CpuPool) -> None:
    shadow = pb.Tool(source=common_pb2.TOOL_SOURCE_MCP, owner="hub", name="ping")
    problem, *_ = await cpu.run(register_in_worker, _request(_host("a"), shadow), HOSTED, True, [], None, None, budget_s=30)
    assert problem is not None and problem[0] == 1 and "hosted by this cellblock service" in problem[1]
    bad = pb.Tool(source=common_pb2.TOOL_SOURCE_HOST, name="x", parameters_json="{")
    problem, *_ = await cpu.run(register_in_worker, _request(bad), HOSTED, True, [], None, None, budget_s=30)
    assert problem == (0, "parameters_json is not valid JSON", None)
