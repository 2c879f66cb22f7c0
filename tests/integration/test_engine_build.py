"""Snapshots are bound to the engine build of the image that made them (issue 12 item 5).

SPEC §10.6 item 6, §16.1 item 8, [R19]. The test really rebuilds the cell
image: a second image is built from the first with one more layer, and a run
suspended in a cell of the first image is resumed in a cell of the second.
"""

from __future__ import annotations

import io
import os
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import docker
import pytest
import pytest_asyncio

from cellblock.client import CellblockClient, Scope, Tool
from cellblock.server.app import ServerSettings, Service, start_service
from cellblock.server.cells import Cell, CellSpec, DockerExecutor, Executor
from cellblock.server.cells._docker import DockerExecutorConfig
from tests.support.cells import state_dir_in

pytestmark = pytest.mark.asyncio(loop_scope="session")

IMAGE = os.environ.get("CELLBLOCK_IMAGE", "cellblock-cell:dev")
GUEST = "/opt/cellblock/app/cellblock/guest"
#: Rebuilds of IMAGE: one changes the controller (a new engine build), one only adds an unrelated file.
REBUILDS = {
    "controller changed": f"RUN printf '\\n// rebuilt {uuid.uuid4().hex}\\n' >> {GUEST}/controller.js",
    "unrelated file added": "RUN echo rebuilt > /opt/cellblock/REBUILT",
}


class ImageSwitchExecutor(Executor):
    """Two real Docker executors, one per image; :meth:`use` picks the one new cells start from.

    It stands in for a service restarted onto a rebuilt image while keeping its
    suspended runs (the run store would keep them across the restart): every
    cell is a real locked-down container of the chosen image.
    """

    name = "docker"

    def __init__(self, first: DockerExecutor, second: DockerExecutor) -> None:
        super().__init__()
        self.first, self.second = first, second
        self.current = first

    def use(self, executor: DockerExecutor) -> None:
        self.current = executor

    @property
    def cell_uid(self) -> int:
        return self.current.cell_uid

    async def check(self) -> None:
        await self.first.check()
        await self.second.check()

    async def start(self, spec: CellSpec) -> Cell:
        self.cells_started += 1
        return await self.current.start(spec)

    async def close(self) -> None:
        await self.first.close()
        await self.second.close()


def _engine_build_id(client: docker.DockerClient, image: str) -> str:
    out = client.containers.run(image, entrypoint=["python3", "-c", "from cellblock.guest._vm import engine_build_id; print(engine_build_id())"], remove=True, network_mode="none")
    return bytes(out).decode().strip()


@pytest.fixture(scope="module", params=sorted(REBUILDS))
def rebuilt_image(request: pytest.FixtureRequest, docker_client: docker.DockerClient) -> Iterator[tuple[str, str]]:
    """Builds a second image from IMAGE with one more layer; yields ``(case, tag)``."""
    case = request.param
    tag = f"cellblock-cell-rebuilt-test:{uuid.uuid4().hex[:12]}"
    dockerfile = f"FROM {IMAGE}\nUSER root\n{REBUILDS[case]}\nUSER 65532:65532\n"
    docker_client.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=tag, rm=True, forcerm=True)
    try:
        yield case, tag
    finally:
        docker_client.images.remove(tag, force=True)


@pytest_asyncio.fixture(loop_scope="session")
async def switching_service(rebuilt_image: tuple[str, str]) -> AsyncIterator[tuple[Service, ImageSwitchExecutor]]:
    _, tag = rebuilt_image
    executor = ImageSwitchExecutor(DockerExecutor(DockerExecutorConfig(image=IMAGE)), DockerExecutor(DockerExecutorConfig(image=tag)))
    with tempfile.TemporaryDirectory(prefix="cellblock-test-rebuilt-") as socket_dir:
        settings = ServerSettings(address="127.0.0.1:0", executor="docker", image=IMAGE, code_mode={"enabled": True}, socket_dir=socket_dir, state_dir=state_dir_in(socket_dir), warm_pool=0)
        svc = await start_service(settings, executor=executor)
        try:
            yield svc, executor
        finally:
            await svc.stop()


async def test_run_suspended_under_one_image_resumes_only_under_the_same_engine_build(
    docker_client: docker.DockerClient, rebuilt_image: tuple[str, str], switching_service: tuple[Service, ImageSwitchExecutor]
) -> None:
    case, tag = rebuilt_image
    service, executor = switching_service
    changed = _engine_build_id(docker_client, IMAGE) != _engine_build_id(docker_client, tag)
    assert changed == (case == "controller changed"), "the engine build id must follow the engine, controller and snapshot code"
    scope = Scope(session_id=f"rebuilt-{uuid.uuid4().hex[:8]}", agent_run_id="a")
    calls: list[Any] = []

    async def echo(tool_input: dict[str, Any], call: Any) -> dict[str, Any]:
        calls.append(tool_input)
        return {"details": tool_input}

    async with await CellblockClient.connect(service.address) as client:
        await client.put_catalog(scope, [Tool(source="host", owner="core", name="echo")])
        program = "const kept = { n: 41 };\nawait yield_control('rebuild');\nreturn (await tools.callValue('echo', { n: kept.n + 1 })).n;"
        first = await client.exec(scope, tool_call_id="r19", code=program, handlers={"echo": echo})
        assert first.status == "waiting", first.raw_json
        executor.use(executor.second)
        resumed = await client.wait(scope, tool_call_id="r19-wait", run_id=first.run_id, handlers={"echo": echo})
        if changed:
            assert resumed.status == "failed" and resumed.code == "runtime_unavailable" and resumed.failure_phase == "host", resumed.raw_json
            assert resumed.error == "cell runtime unavailable: the suspended program was made by a different cell image and cannot be restored here."
            assert calls == []
            again = await client.wait(scope, tool_call_id="r19-again", run_id=first.run_id, handlers={"echo": echo})
            assert again.error == "this run is unknown or has expired; start a new exec instead of waiting."
        else:
            assert resumed.status == "completed" and resumed.value == 42, resumed.raw_json
