"""A cell image whose precompiled QuickJS module is corrupt fails closed: no leg runs, the caller gets [R12].

The module is native code the cell maps and runs as it is (guest/_engine_load.py,
DESIGN.md §3). The test builds a second image from IMAGE with one byte appended
to ``/opt/cellblock/quickjs.cwasm`` and runs legs in real locked-down cells of
it, with and without a warm pool: every leg fails as ``runtime_unavailable``
before any guest code or tool call ran, and the cell's own output names the
reason.
"""

from __future__ import annotations

import io
import tempfile
import uuid
from collections.abc import Iterator
from typing import Any

import docker
import pytest

from cellblock.client import CellblockClient, Scope, Tool
from cellblock.server.app import ServerSettings, start_service
from tests.support.cells import IMAGE, OCI_RUNTIME, state_dir_in

MODULE = "/opt/cellblock/quickjs.cwasm"


@pytest.fixture(scope="module")
def corrupt_image(docker_client: docker.DockerClient) -> Iterator[str]:
    """IMAGE with one byte appended to its precompiled module (its recorded SHA-256 left as built)."""
    tag = f"cellblock-cell-corrupt-module-test:{uuid.uuid4().hex[:12]}"
    dockerfile = f"FROM {IMAGE}\nUSER root\nRUN printf x >> {MODULE}\nUSER 65532:65532\n"
    docker_client.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=tag, rm=True, forcerm=True)
    try:
        yield tag
    finally:
        docker_client.images.remove(tag, force=True)


def test_the_cell_says_why_it_stops(docker_client: docker.DockerClient, corrupt_image: str) -> None:
    container = docker_client.containers.run(corrupt_image, detach=True, network_mode="none", read_only=True, cap_drop=["ALL"], runtime=OCI_RUNTIME)
    try:
        assert container.wait(timeout=60)["StatusCode"] == 1
        assert container.logs(stdout=False, stderr=True).decode().strip() == (
            f"cellblock-guest: the precompiled QuickJS module {MODULE} is corrupt: its SHA-256 is not the one its image build recorded"
        )
    finally:
        container.remove(force=True)


@pytest.mark.asyncio(loop_scope="session")
@pytest.mark.parametrize("warm_pool", [0, 1])
async def test_no_leg_runs_in_a_cell_with_a_corrupt_module(corrupt_image: str, warm_pool: int) -> None:
    calls: list[Any] = []

    async def echo(tool_input: dict[str, Any], call: Any) -> dict[str, Any]:
        calls.append(tool_input)
        return {"details": tool_input}

    with tempfile.TemporaryDirectory(prefix="cellblock-test-module-") as socket_dir:
        settings = ServerSettings(
            address="127.0.0.1:0", executor="docker", image=corrupt_image, oci_runtime=OCI_RUNTIME, code_mode={"enabled": True}, socket_dir=socket_dir, state_dir=state_dir_in(socket_dir), warm_pool=warm_pool
        )
        service = await start_service(settings)
        try:
            scope = Scope(session_id=f"module-{uuid.uuid4().hex[:8]}", agent_run_id="a")
            async with await CellblockClient.connect(service.address) as client:
                await client.put_catalog(scope, [Tool(source="host", owner="core", name="echo")])
                result = await client.exec(scope, tool_call_id="m", code="await tools.echo({n: 1}); return 1", handlers={"echo": echo})
            assert result.status == "failed" and result.code == "runtime_unavailable", result.raw_json
            assert result.error == "cell runtime unavailable: the cell exited with code 1.", result.raw_json
            assert calls == []
        finally:
            await service.stop()
