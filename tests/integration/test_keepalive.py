"""The server's keepalive policy with a real pinging client (issue 12 item 7).

Clients of gRPC libraries commonly send HTTP/2 keepalive pings every 10 s, also
without data. gRPC servers by default accept one ping per 5 minutes while they
send no data and answer the third early one with GOAWAY (``UNAVAILABLE: Too
many pings``), which used to cut a client off in the middle of a long, quiet
leg. The tests scale the policy down (pings every second against a 500 ms
minimum, the same ratio as 10 s against the default 5 s) so a leg of a few
seconds spans several strike windows.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from cellblock.client import CellblockClient, Scope, Tool, UnavailableError
from cellblock.server.api import keepalive_options
from cellblock.server.app import ServerSettings, Service, start_service
from tests.support.cells import state_dir_in

pytestmark = pytest.mark.asyncio(loop_scope="session")

IMAGE = os.environ.get("CELLBLOCK_IMAGE", "cellblock-cell:dev")
#: A client that pings every second, also between calls, with no ping budget.
PINGING_CLIENT = [
    ("grpc.keepalive_time_ms", 1000),
    ("grpc.keepalive_timeout_ms", 5000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
]


@pytest_asyncio.fixture(loop_scope="session")
async def keepalive_service(request: pytest.FixtureRequest, docker_client: Any) -> AsyncIterator[Service]:
    with tempfile.TemporaryDirectory(prefix="cellblock-test-keepalive-") as socket_dir:
        settings = ServerSettings(
            address="127.0.0.1:0",
            executor="docker",
            image=IMAGE,
            code_mode={"enabled": True, "timeoutMs": 20000},
            socket_dir=socket_dir, state_dir=state_dir_in(socket_dir),
            warm_pool=0,
            keepalive_min_ping_interval_ms=request.param,
        )
        svc = await start_service(settings)
        try:
            yield svc
        finally:
            await svc.stop()


async def _long_quiet_leg(service: Service) -> Any:
    scope = Scope(session_id="keepalive", agent_run_id="a")
    async with await CellblockClient.connect(service.address, channel_options=PINGING_CLIENT) as client:
        await client.put_catalog(scope, [Tool(source="host", owner="core", name="slow")])

        async def slow(tool_input: dict[str, Any], call: Any) -> dict[str, Any]:
            await asyncio.sleep(5)  # the server sends nothing meanwhile: five pings arrive
            return {"details": "done"}

        return await client.exec(scope, tool_call_id="ka", code="return await tools.callValue('slow', {});", handlers={"slow": slow})


@pytest.mark.parametrize("keepalive_service", [500], indirect=True)
async def test_client_pinging_within_the_policy_keeps_its_long_leg(keepalive_service: Service) -> None:
    result = await _long_quiet_leg(keepalive_service)
    assert result.status == "completed" and result.value == "done", result.raw_json


@pytest.mark.parametrize("keepalive_service", [300_000], indirect=True)
async def test_without_the_policy_the_same_client_is_cut_off(keepalive_service: Service) -> None:
    """The gRPC default (one ping per 5 minutes) cuts the client off: why the service sets a policy at all."""
    with pytest.raises(UnavailableError, match="Too many pings"):
        await _long_quiet_leg(keepalive_service)


async def test_default_policy_admits_common_client_defaults() -> None:
    """The defaults: pings without calls permitted, every 5 s or slower (clients ping every 10 s), two strikes."""
    settings = ServerSettings()
    assert settings.keepalive_min_ping_interval_ms == 5000
    assert ServerSettings.from_env({"CELLBLOCK_KEEPALIVE_MIN_PING_INTERVAL_MS": "20000"}).keepalive_min_ping_interval_ms == 20000
    assert keepalive_options(settings.keepalive_min_ping_interval_ms) == [
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_ping_interval_without_data_ms", 5000),
        ("grpc.http2.max_ping_strikes", 2),
    ]
