"""Fixtures of the process tier: a real cellblock service whose cells are local guest agents.

The service, its gRPC server on 127.0.0.1, the bridge sockets, the leg, the runner and the
guest agent with its QuickJS VM are the real ones; only the container layers are missing
(the ``process`` executor, named explicitly). Nothing here needs Docker, so these tests run
in ``make test-fast``. At the end of each module the service must have left no bridge
socket directory behind (only its lock file).
"""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest_asyncio

from cellblock.client import CellblockClient
from cellblock.server.app import ServerSettings, Service, start_service
from cellblock.server.cells import ProcessExecutor
from tests.support.cells import cell_dirs, state_dir_in

SUPPORT = str(Path(__file__).resolve().parents[1] / "support")


async def _service(executor: ProcessExecutor) -> AsyncIterator[Service]:
    with tempfile.TemporaryDirectory(prefix="cellblock-process-") as sockets:
        settings = ServerSettings(address="127.0.0.1:0", executor="process", code_mode={"enabled": True}, socket_dir=sockets, state_dir=state_dir_in(sockets))
        service = await start_service(settings, executor=executor)
        yield service
        await service.stop()
        # The instance's lock file and state directory stay; no bridge directory may.
        assert cell_dirs(sockets) == [], f"bridge directories left behind: {cell_dirs(sockets)}"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def service() -> AsyncIterator[Service]:
    """A service whose cells run the real guest agent (QuickJS) as subprocesses."""
    async for svc in _service(ProcessExecutor()):
        yield svc


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def scripted_service() -> AsyncIterator[Service]:
    """A service whose cells run ``tests/support/scripted_guest.py`` (a guest that follows its source's script)."""
    async for svc in _service(ProcessExecutor(module="scripted_guest", extra_path=(SUPPORT,))):
        yield svc


@pytest_asyncio.fixture(loop_scope="module")
async def client(service: Service) -> AsyncIterator[CellblockClient]:
    async with await CellblockClient.connect(service.address) as c:
        yield c
