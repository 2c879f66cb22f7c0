"""Cell reuse (SPEC §16.2) without Docker: the per-leg token, the end kinds that keep or destroy a cell, the settings.

The bridge, the leg, the reuse rule and the service are the real ones; the cells are the
real guest agent as a subprocess, or ``tests/support/scripted_guest.py`` for ends a real
program cannot produce (a bridge protocol break, an engine trap or memory exhaustion
reported by the guest, an exit without ``end``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
import pytest_asyncio

from cellblock.bridge.v1 import bridge_service_pb2 as pb
from cellblock.bridge.v1 import bridge_service_pb2_grpc as pb_grpc
from cellblock.client import CellblockClient, Scope, Tool
from cellblock.server.app import ServerSettings, Service, start_service
from cellblock.server.cells import CellBridge, ProcessExecutor
from tests.process.conftest import SUPPORT
from tests.support.cells import cell_dirs, state_dir_in

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(60)]


async def _reuse_service(executor: ProcessExecutor, **overrides: int) -> AsyncIterator[Service]:
    with tempfile.TemporaryDirectory(prefix="cellblock-process-reuse-") as sockets:
        settings = ServerSettings(address="127.0.0.1:0", executor="process", code_mode={"enabled": True}, socket_dir=sockets, state_dir=state_dir_in(sockets), store="memory:", cell_reuse="scope", **overrides)
        service = await start_service(settings, executor=executor)
        yield service
        await service.stop()
        assert cell_dirs(sockets) == []


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def scripted_reuse() -> AsyncIterator[Service]:
    async for svc in _reuse_service(ProcessExecutor(module="scripted_guest", extra_path=(SUPPORT,))):
        yield svc


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def real_reuse() -> AsyncIterator[Service]:
    async for svc in _reuse_service(ProcessExecutor()):
        yield svc


async def _attach(bridge: CellBridge, token: str) -> tuple[grpc.aio.Channel, grpc.aio.StreamStreamCall]:  # type: ignore[type-arg]
    channel = grpc.aio.insecure_channel(f"unix:{bridge.socket_path}")
    call = pb_grpc.BridgeServiceStub(channel).Attach()
    await call.write(pb.AttachRequest(hello=pb.Hello(cell_token=token, engine_build_id="test")))
    return channel, call


async def test_a_recycled_bridge_takes_only_the_next_legs_token() -> None:
    with tempfile.TemporaryDirectory(prefix="cellblock-process-token-") as base:
        bridge = await CellBridge.open(base, socket_uid=os.getuid())
        try:
            first_token = bridge.token
            channel, call = await _attach(bridge, first_token)
            await bridge.attached.wait()
            bridge.recycle()
            recycle = await call.read()
            assert recycle.WhichOneof("message") == "recycle"
            next_token = recycle.recycle.next_cell_token
            assert next_token == bridge.token and next_token != first_token and len(next_token) == 64
            assert await call.read() is grpc.aio.EOF  # this leg's stream ends with it
            await channel.close()
            assert not bridge.attached.is_set()
            # The previous leg's token no longer attaches (SPEC §16.2 item 3) ...
            channel, call = await _attach(bridge, first_token)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await call.read()
            assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
            await channel.close()
            # ... the next one does, once.
            channel, call = await _attach(bridge, next_token)
            await bridge.attached.wait()
            await channel.close()
        finally:
            await bridge.close()


@pytest.mark.parametrize(
    ("script", "kept"),
    [
        ("fail:GUEST_ERROR", True),
        ("fail:SYNTAX", True),
        ("garbage", False),
        ("fail:ENGINE_TRAP", False),
        ("fail:MEMORY", False),
        ("fail:INTERRUPTED", False),
        ("fail:UNSETTLEABLE", False),
        ("exit:3", False),
    ],
)
async def test_only_a_clean_end_keeps_the_cell(scripted_reuse: Service, script: str, kept: bool) -> None:
    scope = Scope(session_id=f"scripted-{script}", agent_run_id="a")
    assert scripted_reuse.state.scope_cells is not None
    async with await CellblockClient.connect(scripted_reuse.address) as client:
        await client.put_catalog(scope, [Tool(source="host", name="echo")])
        result = await client.exec(scope, tool_call_id="t", code=f"// SCRIPT:{script}\nreturn 1", handlers={})
        assert result.status == "failed", result.raw_json
        assert (result.metadata.cell_id in scripted_reuse.state.scope_cells.idle_cell_ids()) is kept
        await client.delete_catalog(scope)
        assert result.metadata.cell_id not in scripted_reuse.state.scope_cells.idle_cell_ids()


async def test_consecutive_legs_run_in_one_agent_with_fresh_vms(real_reuse: Service) -> None:
    scope = Scope(session_id="real", agent_run_id="a")
    async with await CellblockClient.connect(real_reuse.address) as client:
        await client.put_catalog(scope, [Tool(source="host", name="echo")])
        first = await client.exec(scope, tool_call_id="a", code="globalThis.x = 1; return typeof x", handlers={})
        second = await client.exec(scope, tool_call_id="b", code="return typeof x", handlers={})
        assert (first.value, second.value) == ("number", "undefined")
        assert first.metadata.cell_id == second.metadata.cell_id
    assert real_reuse.executor.cells_started == 1


async def test_idle_cells_are_bounded_over_all_scopes() -> None:
    async for service in _reuse_service(ProcessExecutor(), max_concurrent_legs=2):
        assert service.state.scope_cells is not None
        async with await CellblockClient.connect(service.address) as client:
            cells = []
            for n in range(3):
                scope = Scope(session_id=f"bounded-{n}", agent_run_id="a")
                await client.put_catalog(scope, [Tool(source="host", name="echo")])
                cells.append((await client.exec(scope, tool_call_id="t", code="return 1", handlers={})).metadata.cell_id)
            # The cell idle longest made room for the newest.
            assert service.state.scope_cells.idle_cell_ids() == set(cells[1:])


@pytest.mark.parametrize(
    "env",
    [{"CELLBLOCK_CELL_REUSE": "container"}, {"CELLBLOCK_CELL_REUSE": "Scope"}, {"CELLBLOCK_CELL_MAX_LEGS": "0"}, {"CELLBLOCK_CELL_IDLE_S": "61"}, {"CELLBLOCK_CELL_MAX_AGE_S": "-1"}, {"CELLBLOCK_CELL_MAX_AGE_S": "inf"}, {"CELLBLOCK_CELL_MAX_AGE_S": "nan"}, {"CELLBLOCK_CELL_MAX_LEGS": "1.5"}],
)
async def test_invalid_reuse_settings_stop_the_start(env: dict[str, str]) -> None:
    with pytest.raises(ValueError, match="CELLBLOCK_CELL_"):
        ServerSettings.from_env(env)


async def test_a_service_with_invalid_reuse_does_not_start() -> None:
    with pytest.raises(ValueError, match="CELLBLOCK_CELL_REUSE"):
        with tempfile.TemporaryDirectory(prefix="cellblock-process-reuse-") as sockets:
            await start_service(ServerSettings(address="127.0.0.1:0", executor="process", socket_dir=sockets, state_dir=state_dir_in(sockets), store="memory:", cell_reuse="sometimes"))


async def test_the_default_is_leg() -> None:
    assert ServerSettings.from_env({}).cell_reuse == "leg"
    assert ServerSettings.from_env({"CELLBLOCK_CELL_REUSE": "scope"}).cell_reuse == "scope"


async def test_the_server_refuses_an_invalid_setting_in_one_line(tmp_path: Path) -> None:
    """``python -m cellblock.server`` with a bad reuse setting exits with one ``cellblock:`` line, no traceback."""
    root = Path(__file__).resolve().parents[2]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(str(root / p) for p in ("proto", "server", "client")),
        "CELLBLOCK_CELL_REUSE": "sometimes",
        "CELLBLOCK_SOCKET_DIR": str(tmp_path / "sockets"),
        "CELLBLOCK_STATE_DIR": str(tmp_path / "state"),
        "CELLBLOCK_ADDRESS": "127.0.0.1:0",
    }
    done = subprocess.run([sys.executable, "-m", "cellblock.server"], env=env, capture_output=True, text=True, timeout=60, check=False)  # noqa: S603
    assert done.returncode != 0
    assert "cellblock: invalid setting: CELLBLOCK_CELL_REUSE must be one of" in done.stderr
    assert "Traceback" not in done.stderr
