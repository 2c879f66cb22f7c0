"""The host watchdog and the bridge's own defences, with misbehaving guests.

These use the `process` executor (named explicitly, as only tests and
development may) to run substitute guest agents; the bridge, the leg and the
host watchdog under test are the real ones.
"""

from __future__ import annotations

import asyncio
import os
import stat
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
import pytest_asyncio

from cellblock.bridge.v1 import bridge_service_pb2 as pb
from cellblock.bridge.v1 import bridge_service_pb2_grpc as pb_grpc
from cellblock.client import CellblockClient, LimitOverrides, Scope, Tool
from cellblock.server.app import ServerSettings, Service, start_service
from cellblock.server.cells import CellBridge, ProcessExecutor
from cellblock.v1 import code_mode_service_pb2 as cpb
from cellblock.v1 import code_mode_service_pb2_grpc as cpb_grpc
from cellblock.v1 import common_pb2
from tests.support.cells import cell_dirs, state_dir_in

# Substitute guests through the process executor: no Docker needed.
pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.process]
SUPPORT = str(Path(__file__).resolve().parents[1] / "support")


@pytest_asyncio.fixture(loop_scope="session")
async def hanging_service() -> AsyncIterator[Service]:
    with tempfile.TemporaryDirectory() as sockets:
        executor = ProcessExecutor(module="hanging_guest", extra_path=(SUPPORT,))
        svc = await start_service(ServerSettings(address="127.0.0.1:0", executor="process", code_mode={"enabled": True}, socket_dir=sockets, state_dir=state_dir_in(sockets)), executor=executor)
        yield svc
        await svc.stop()
        assert cell_dirs(sockets) == []


async def test_host_watchdog_kills_a_cell_that_ignores_its_deadline(hanging_service: Service) -> None:
    async with await CellblockClient.connect(hanging_service.address) as client:
        scope = Scope("watchdog", "watchdog")
        await client.put_catalog(scope, [Tool(source="host", name="noop")])
        started = time.monotonic()
        result = await client.exec(scope, tool_call_id="w", code="return 1", handlers={}, limits=LimitOverrides(timeout_ms=1000))
        elapsed = time.monotonic() - started
    assert (result.status, result.code, result.failure_phase) == ("failed", "timeout", "host")
    assert result.error == "timeout exceeded: the cell did not stop within 1000 ms plus 2000 ms grace and was killed."
    assert 2.9 < elapsed < 6, f"killed after {elapsed:.1f}s"


async def _attach(socket: str, token: str) -> tuple[grpc.aio.Channel, grpc.aio.StreamStreamCall]:
    channel = grpc.aio.insecure_channel(f"unix:{socket}")
    call = pb_grpc.BridgeServiceStub(channel).Attach()
    await call.write(pb.AttachRequest(hello=pb.Hello(cell_token=token, engine_build_id="test")))
    return channel, call


async def test_bridge_socket_is_private_and_its_token_is_one_time() -> None:
    with tempfile.TemporaryDirectory() as base:
        bridge = await CellBridge.open(base, socket_uid=os.getuid())
        try:
            assert stat.S_IMODE(os.stat(bridge.directory).st_mode) == 0o700
            assert stat.S_IMODE(os.stat(bridge.socket_path).st_mode) == 0o600
            assert len(bridge.token) == 64

            channel, call = await _attach(bridge.socket_path, "0" * 64)
            with pytest.raises(grpc.aio.AioRpcError) as wrong:
                await call.read()
            assert wrong.value.code() == grpc.StatusCode.PERMISSION_DENIED
            await channel.close()
            assert not bridge.attached.is_set()

            channel, call = await _attach(bridge.socket_path, bridge.token)
            await asyncio.wait_for(bridge.attached.wait(), 5)
            channel2, call2 = await _attach(bridge.socket_path, bridge.token)
            with pytest.raises(grpc.aio.AioRpcError) as reused:
                await call2.read()
            assert reused.value.code() == grpc.StatusCode.PERMISSION_DENIED
            await channel2.close()
            await channel.close()
        finally:
            await bridge.close()
        assert not os.path.exists(bridge.directory)


async def test_bridge_refuses_a_first_message_that_is_not_hello() -> None:
    with tempfile.TemporaryDirectory() as base:
        bridge = await CellBridge.open(base, socket_uid=os.getuid())
        try:
            channel = grpc.aio.insecure_channel(f"unix:{bridge.socket_path}")
            call = pb_grpc.BridgeServiceStub(channel).Attach()
            await call.write(pb.AttachRequest(request=pb.GuestRequest(bridge_id="bridge:search:1", method="search", args_json="[]")))
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await call.read()
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            await channel.close()
        finally:
            await bridge.close()


@pytest_asyncio.fixture(loop_scope="session")
async def silent_service(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Service]:
    # The attach is bounded by the cell wait ([R21]); 1 s here, so the test is quick.
    with tempfile.TemporaryDirectory() as sockets:
        executor = ProcessExecutor(module="silent_guest", extra_path=(SUPPORT,))
        svc = await start_service(ServerSettings(address="127.0.0.1:0", executor="process", code_mode={"enabled": True}, socket_dir=sockets, state_dir=state_dir_in(sockets), cell_wait_ms=1000), executor=executor)
        yield svc
        await svc.stop()
        assert cell_dirs(sockets) == []


async def test_attach_timeout_holds_while_runtime_events_wait_for_the_cell(silent_service: Service) -> None:
    """A runtime event queued before the cell attaches neither spins the leg nor defers the attach timeout.

    The tool result arrives while the cell is still starting; the leg keeps it for after the
    attach (it used to take it off the queue and put it back in a loop, restarting the attach
    timeout on every turn, so a cell that never attached held the leg until the caller gave up).
    """
    scope = Scope("attach", "attach")
    async with await CellblockClient.connect(silent_service.address) as client:
        await client.put_catalog(scope, [Tool(source="host", name="noop")])
    async with grpc.aio.insecure_channel(silent_service.address) as channel:
        call = cpb_grpc.CodeModeServiceStub(channel).Exec()
        start = cpb.ExecStart(scope=common_pb2.Scope(session_id=scope.session_id, agent_run_id=scope.agent_run_id), tool_call_id="a", arguments_json='{"code": "return 1"}')
        await call.write(cpb.ExecRequest(start=start))
        await call.write(cpb.ExecRequest(tool_result=cpb.ToolResult(nested_call_id="nested_unknown", ok_json="1")))
        started = time.monotonic()

        async def result() -> cpb.Result:
            async for message in call:
                if message.WhichOneof("message") == "result":
                    return message.result
            raise AssertionError("the stream ended without a result")

        got = await asyncio.wait_for(result(), timeout=15)
        elapsed = time.monotonic() - started
    assert got.code == cpb.ERROR_CODE_RUNTIME_UNAVAILABLE, got
    assert "no cell was ready within 1000 ms" in got.result_json
    assert elapsed < 6, f"ended after {elapsed:.1f}s"
