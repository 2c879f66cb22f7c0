"""Fixtures: one real cellblock service with the Docker executor per session.

The service listens on 127.0.0.1 (a real socket); cells are real locked-down
containers of `cellblock-cell:dev`. At session end the suite asserts that no
cell container, bridge socket or socket directory was left behind.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator

import docker
import pytest
import pytest_asyncio

from cellblock.client import CellblockClient, Scope
from cellblock.server.app import ServerSettings, Service, start_service
from cellblock.server.cells import DockerExecutor
from tests.support.cells import IMAGE, OCI_RUNTIME, cell_dirs
from tests.support.service_process import remove_cells_of


@pytest.fixture(scope="session")
def docker_client() -> Iterator[docker.DockerClient]:
    client = docker.from_env()
    try:
        client.ping()
        client.images.get(IMAGE)
    except Exception as exc:  # noqa: BLE001
        pytest.fail(f"integration tests need a Docker engine and {IMAGE}; run `make image` ({exc})")
    if OCI_RUNTIME and OCI_RUNTIME not in client.info().get("Runtimes", {}):
        pytest.fail(f"CELLBLOCK_OCI_RUNTIME={OCI_RUNTIME} is not registered with the Docker engine; run scripts/ensure-runsc.sh (make engine)")
    yield client
    client.close()


@pytest.fixture(scope="session")
def socket_dir() -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="cellblock-test-cells-") as d:
        yield d


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def service(docker_client: docker.DockerClient, socket_dir: str) -> AsyncIterator[Service]:
    # The embedded default store (SQLite, WAL) in a directory of this session only.
    state_dir = tempfile.mkdtemp(prefix="cellblock-test-state-")
    settings = ServerSettings(address="127.0.0.1:0", executor="docker", image=IMAGE, oci_runtime=OCI_RUNTIME, code_mode={"enabled": True, "timeoutMs": 8000}, socket_dir=socket_dir, state_dir=state_dir)
    svc = await start_service(settings)
    yield svc
    await svc.stop()
    # Nothing may be left behind: containers, sockets, socket directories.
    await asyncio.sleep(0.2)
    executor = svc.executor
    assert isinstance(executor, DockerExecutor)
    left = executor.list_cell_containers()
    assert left == [], f"cell containers left behind: {left}"
    assert cell_dirs(socket_dir) == [], f"bridge directories left behind: {cell_dirs(socket_dir)}"
    shutil.rmtree(state_dir, ignore_errors=True)


@pytest_asyncio.fixture(loop_scope="session")
async def client(service: Service) -> AsyncIterator[CellblockClient]:
    async with await CellblockClient.connect(service.address) as c:
        yield c


_counter = iter(range(1, 1_000_000))


@pytest.fixture
def scope() -> Scope:
    n = next(_counter)
    return Scope(session_id=f"sess-{os.getpid()}-{n}", agent_run_id=f"agent-{n}")



@pytest.fixture(params=["sqlite", "postgresql"])
def durable_store_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A fresh durable run store: a SQLite file, or a new database on the session's real PostgreSQL."""
    if request.param == "sqlite":
        return "sqlite:///" + str(tmp_path_factory.mktemp("store") / "runs.sqlite3").lstrip("/")
    cluster = request.getfixturevalue("pg_cluster")
    return str(cluster.database(f"it_{next(_databases)}_{os.getpid()}"))


_databases = iter(range(1, 1_000_000))


@pytest.fixture
def process_sockets() -> Iterator[str]:
    """A bridge-socket directory for service processes; cells a killed process left are removed after."""
    with tempfile.TemporaryDirectory(prefix="cellblock-proc-cells-") as d:
        yield d
        remove_cells_of(d)
