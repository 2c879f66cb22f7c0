"""The Exec and Wait stream protocol: one start message per stream (SPEC §3.1 item 4, [A04]), over real gRPC and real cells."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import grpc
import pytest

from cellblock.client import CellblockClient, Scope, Tool
from cellblock.v1 import code_mode_service_pb2 as cpb
from cellblock.v1 import code_mode_service_pb2_grpc as cpb_grpc
from cellblock.v1 import common_pb2
from tests.support.cells import ended_without_a_run

pytestmark = pytest.mark.asyncio(loop_scope="session")

CALLS_THEN_RETURNS = 'await tools.callValue("host:core:echo", {}); return 1'


async def _second_start_when_called(channel: grpc.aio.Channel, kind: str, first: Any, second: Any) -> grpc.aio.AioRpcError:
    """Sends ``first``, then ``second`` (another start) once the leg's ToolCall arrived; returns the RPC's error."""
    queue: asyncio.Queue[Any] = asyncio.Queue()
    await queue.put(first)

    async def requests() -> Any:
        while True:
            yield await queue.get()

    stub = cpb_grpc.CodeModeServiceStub(channel)
    call = stub.Exec(requests()) if kind == "exec" else stub.Wait(requests())
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        async for response in call:
            assert response.WhichOneof("message") != "result", response
            if response.WhichOneof("message") == "tool_call":
                await queue.put(second)
    return raised.value


async def test_a_second_exec_start_mid_stream_is_invalid_argument_a04_and_ends_the_leg(service: Any, client: CellblockClient, scope: Scope) -> None:
    await client.put_catalog(scope, [Tool(source="host", owner="core", name="echo")])
    wire_scope = common_pb2.Scope(session_id=scope.session_id, agent_run_id=scope.agent_run_id)

    def start(tool_call_id: str) -> cpb.ExecRequest:
        return cpb.ExecRequest(start=cpb.ExecStart(scope=wire_scope, tool_call_id=tool_call_id, arguments_json=json.dumps({"code": CALLS_THEN_RETURNS})))

    started = asyncio.get_running_loop().time()
    async with grpc.aio.insecure_channel(service.address) as channel:
        error = await _second_start_when_called(channel, "exec", start("first"), start("second"))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error
    assert error.details() == "the Exec stream already had its start message; send start once, as the stream's first message. The leg was ended."
    await ended_without_a_run(service, client, scope)
    assert asyncio.get_running_loop().time() - started < 7  # the leg's deadline is 8 s (conftest): ended, not timed out


async def test_a_second_wait_start_mid_stream_is_invalid_argument_a04(service: Any, client: CellblockClient, scope: Scope) -> None:
    await client.put_catalog(scope, [Tool(source="host", owner="core", name="echo")])
    parked = await client.exec(scope, tool_call_id="park", code='await yield_control("x"); ' + CALLS_THEN_RETURNS, handlers={})
    assert parked.status == "waiting", parked.raw_json
    wire_scope = common_pb2.Scope(session_id=scope.session_id, agent_run_id=scope.agent_run_id)
    arguments = f'{{"runId": "{parked.run_id}"}}'
    first = cpb.WaitRequest(start=cpb.WaitStart(scope=wire_scope, tool_call_id="w1", arguments_json=arguments))
    second = cpb.WaitRequest(start=cpb.WaitStart(scope=wire_scope, tool_call_id="w2", arguments_json=arguments))
    async with grpc.aio.insecure_channel(service.address) as channel:
        error = await _second_start_when_called(channel, "wait", first, second)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error
    assert error.details() == "the Wait stream already had its start message; send start once, as the stream's first message. The leg was ended."
    await ended_without_a_run(service, client, scope)
