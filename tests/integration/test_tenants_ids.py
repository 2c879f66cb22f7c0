"""Ids and tool identifiers are bounded (issue 11 item 7; SPEC §3.1 item 5, §3.2 item 3).

Table-driven over the protos: every string field named ``id`` or ``*_id`` of every request
message of every public RPC (at any depth; for a stream, in its first message) gets 300
characters, and the real service must answer ``INVALID_ARGUMENT`` [A03] naming the field.
Before, ``ListCatalogs`` accepted a 300-character ``session_id`` and a 5 MB
``tool_call_id`` went into every log line. Tool ``owner``, ``name`` and ``label`` are capped
at registration ([C03]): a 100,000-character name once registered and made every
``tool_call.dispatched`` line about 150 KB.
"""

from __future__ import annotations

import json
from typing import Any

import grpc
import pytest
import structlog
from google.protobuf.descriptor import Descriptor, FieldDescriptor, MethodDescriptor
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass

from cellblock.client import CellblockClient, CellblockError, Scope, Tool
from cellblock.server.app import Service
from cellblock.server.limits import MAX_SCOPE_ID_CHARS, MAX_TOOL_IDENTIFIER_CHARS
from cellblock.v1 import catalog_service_pb2, code_mode_service_pb2, run_service_pb2

pytestmark = pytest.mark.asyncio(loop_scope="session")

_SERVICES = [
    catalog_service_pb2.DESCRIPTOR.services_by_name["CatalogService"],
    code_mode_service_pb2.DESCRIPTOR.services_by_name["CodeModeService"],
    run_service_pb2.DESCRIPTOR.services_by_name["RunService"],
]


def _id_paths(descriptor: Descriptor, seen: tuple[str, ...] = ()) -> list[list[FieldDescriptor]]:
    """Every path from a request type to a string ``id`` / ``*_id`` field."""
    paths: list[list[FieldDescriptor]] = []
    for field in descriptor.fields:
        if field.type == FieldDescriptor.TYPE_STRING and (field.name == "id" or field.name.endswith("_id")):
            paths.append([field])
        elif field.message_type is not None and field.message_type.full_name not in seen:
            paths += [[field, *rest] for rest in _id_paths(field.message_type, (*seen, descriptor.full_name))]
    return paths


def _cases() -> list[tuple[MethodDescriptor, list[FieldDescriptor]]]:
    cases = []
    for service in _SERVICES:
        for method in service.methods:
            for path in _id_paths(method.input_type):
                # A stream's ids are checked in its first message (its start); a later
                # ToolResult with a long nested_call_id is ignored (SPEC §3.1 item 5).
                if method.client_streaming and path[0].name != "start":
                    continue
                cases.append((method, path))
    return cases


CASES = _cases()


def _request(method: MethodDescriptor, path: list[FieldDescriptor]) -> Message:
    request = GetMessageClass(method.input_type)()
    target = request
    for field in path[:-1]:
        target = getattr(target, field.name).add() if field.is_repeated else getattr(target, field.name)
    leaf = path[-1]
    if leaf.is_repeated:
        getattr(target, leaf.name).append("i" * (MAX_SCOPE_ID_CHARS + 44))
    else:
        setattr(target, leaf.name, "i" * (MAX_SCOPE_ID_CHARS + 44))
    return request


async def test_the_table_covers_the_ids_of_every_rpc() -> None:
    named = {f"{m.name}:{'.'.join(f.name for f in p)}" for m, p in CASES}
    # The ones the reviewer and the SPEC name, so a proto refactor cannot empty the table.
    for expected in ("ListCatalogs:session_id", "PutCatalog:scope.session_id", "Exec:start.tool_call_id", "Exec:start.turn_id", "GetRun:run_id", "GetToolSurface:model_id"):
        assert expected in named, sorted(named)
    assert {m.name for m, _ in CASES} == {m.name for s in _SERVICES for m in s.methods}


@pytest.mark.parametrize(("method", "path"), CASES, ids=[f"{m.name}:{'.'.join(f.name for f in p)}" for m, p in CASES])
async def test_every_id_field_of_every_rpc_is_capped(service: Service, method: MethodDescriptor, path: list[FieldDescriptor]) -> None:
    request = _request(method, path)
    output = GetMessageClass(method.output_type)
    name = f"/{method.containing_service.full_name}/{method.name}"
    async with grpc.aio.insecure_channel(service.address) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            if method.client_streaming:
                call = channel.stream_stream(name, request_serializer=lambda m: m.SerializeToString(), response_deserializer=output.FromString)(iter([request]))
                async for _ in call:
                    pass
            else:
                await channel.unary_unary(name, request_serializer=lambda m: m.SerializeToString(), response_deserializer=output.FromString)(request, timeout=30)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT, raised.value
    field = ".".join(f.name for f in path)
    assert raised.value.details() == f"{field} is longer than {MAX_SCOPE_ID_CHARS} characters.", raised.value.details()


async def test_an_id_at_the_cap_is_accepted(client: CellblockClient) -> None:
    scope = Scope(session_id="s" * MAX_SCOPE_ID_CHARS, agent_run_id="a" * MAX_SCOPE_ID_CHARS)
    await client.put_catalog(scope, [Tool(source="host", owner="core", name="noop")])
    assert [s.scope.agent_run_id for s in (await client.list_catalogs("s" * MAX_SCOPE_ID_CHARS)).catalogs] == ["a" * MAX_SCOPE_ID_CHARS]


@pytest.mark.parametrize(
    ("field", "tool"),
    [
        ("name", {"source": "host", "owner": "core", "name": "n" * 100_000}),
        ("owner", {"source": "mcp", "owner": "o" * 50_000, "name": "x"}),
        ("label", {"source": "client", "name": "x", "label": "l" * (MAX_TOOL_IDENTIFIER_CHARS + 1)}),
        ("name", {"source": "client", "name": "n" * (MAX_TOOL_IDENTIFIER_CHARS + 1)}),
    ],
)
async def test_tool_identifiers_longer_than_the_cap_are_refused(client: CellblockClient, scope: Scope, field: str, tool: dict[str, Any]) -> None:
    with pytest.raises(CellblockError) as raised:
        await client.put_catalog(scope, [Tool(**tool)])
    text = str(raised.value)
    assert text.endswith(f"{field} is longer than {MAX_TOOL_IDENTIFIER_CHARS} characters."), text[:400]
    assert len(text) < 1000, len(text)  # the error echoes at most 200 characters of the tool


async def test_identifiers_at_the_cap_register_and_their_log_lines_stay_bounded(client: CellblockClient, scope: Scope) -> None:
    owner, name = "o" * MAX_TOOL_IDENTIFIER_CHARS, "n" * MAX_TOOL_IDENTIFIER_CHARS
    await client.put_catalog(scope, [Tool(source="host", owner=owner, name=name)])

    async def handler(_input: dict[str, Any], _info: Any) -> dict[str, Any]:
        return {"ok": True}

    with structlog.testing.capture_logs() as logs:
        result = await client.exec(scope, tool_call_id="t" * MAX_SCOPE_ID_CHARS, code=f'return (await tools.callValue("host:{owner}:{name}", {{}})).ok', handlers={f"host:{owner}:{name}": handler})
    assert result.status == "completed" and result.value is True, result.raw_json
    assert logs, "the leg wrote no log lines"
    assert max(len(json.dumps(line, default=str)) for line in logs) < 8 * 1024


async def test_an_exec_nested_too_deeply_gets_the_depth_reason(client: CellblockClient, scope: Scope) -> None:
    # Wait's [W07] is checked in tests/unit/source/test_input.py (the client itself parses wait arguments).
    await client.put_catalog(scope, [Tool(source="host", owner="core", name="noop")])
    deep = '{"code":"return 1","x":' + "[" * 100_000 + "]" * 100_000 + "}"
    result = await client.exec(scope, tool_call_id="deep", arguments=deep, handlers={})
    assert result.status == "failed" and result.code == "invalid_input", result.raw_json
    assert result.error == "exec input is nested too deeply to read; send a JSON object whose code field is a string.", result.error


@pytest.mark.parametrize("length", [MAX_SCOPE_ID_CHARS + 1, 1_000_000])
async def test_a_wait_run_id_longer_than_the_cap_is_refused_before_any_lookup(client: CellblockClient, scope: Scope, length: int) -> None:
    # The run id is inside the model's arguments, so the refusal is a result ([W08], SPEC §5.2 item 2), not a status.
    await client.put_catalog(scope, [Tool(source="host", owner="core", name="noop")])
    with structlog.testing.capture_logs() as logs:
        result = await client.wait(scope, tool_call_id="w", arguments={"runId": "r" * length})
    assert result.status == "failed" and result.code == "invalid_input", result.raw_json
    assert result.error == f"runId is longer than {MAX_SCOPE_ID_CHARS} characters; pass the runId of the waiting result unchanged.", result.error
    assert all(len(json.dumps(line, default=str)) < 8 * 1024 for line in logs)


async def test_a_wait_run_id_at_the_cap_is_looked_up(client: CellblockClient, scope: Scope) -> None:
    await client.put_catalog(scope, [Tool(source="host", owner="core", name="noop")])
    result = await client.wait(scope, tool_call_id="w", arguments={"runId": "r" * MAX_SCOPE_ID_CHARS})
    assert result.status == "failed" and result.code == "invalid_input", result.raw_json
    assert result.error == "this run is unknown or has expired; start a new exec instead of waiting.", result.error
