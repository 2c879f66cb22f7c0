"""The TCP bridge with a real cell, under the Kubernetes seccomp profile.

The cell image, locked down by the same lockdown, under the Kubernetes seccomp profile (the Docker
one plus AF_INET/AF_INET6 sockets), dials a BridgeListener and runs a leg. Docker's host network
stands in for the pod network (with the engine's networking enabled again: the only change to the Docker options besides the profile and the
bridge variables): this is what a cell pod does on a cluster (SPEC §16.3 item 2).
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
from collections.abc import AsyncIterator

import docker
import pytest
import pytest_asyncio

from cellblock.bridge.v1 import bridge_service_pb2 as bpb
from cellblock.server.cells import DEFAULT_LOCKDOWN, BridgeListener, CellSpec, DockerExecutorConfig, container_options
from tests.support.cells import IMAGE, OCI_RUNTIME

pytestmark = pytest.mark.asyncio(loop_scope="session")


def _cell(client: docker.DockerClient, listener: BridgeListener, token: str, *, profile: str) -> object:
    spec = CellSpec(cell_id="cell_" + secrets.token_hex(8), bridge_dir="/nonexistent", cell_token=token, memory_limit_bytes=64 << 20)
    options = container_options(DockerExecutorConfig(image=IMAGE, runtime=OCI_RUNTIME), spec, profile)
    options.update(network_mode="host", network_disabled=False, volumes={}, environment={"CELLBLOCK_BRIDGE_ADDRESS": f"127.0.0.1:{listener.port}", "CELLBLOCK_CELL_TOKEN": token}, name=f"cellblock-tcp-{os.getpid()}-{secrets.token_hex(3)}")
    return client.containers.run(**options)


@pytest_asyncio.fixture(loop_scope="session")
async def listener() -> AsyncIterator[BridgeListener]:
    if OCI_RUNTIME == "runsc":
        pytest.skip("runsc is registered with --network=none and without the allow-list (scripts/ensure-runsc.sh): no host network to dial")
    bridge_port = BridgeListener("127.0.0.1:0")
    await bridge_port.start()
    yield bridge_port
    await bridge_port.close()


async def test_a_cell_under_the_kubernetes_profile_attaches_over_tcp_and_runs_a_leg(docker_client: docker.DockerClient, listener: BridgeListener) -> None:
    bridge = listener.open()
    container = await asyncio.to_thread(_cell, docker_client, listener, bridge.token, profile=json.dumps(DEFAULT_LOCKDOWN.seccomp_profile_for(tcp_bridge=True)))
    try:
        await asyncio.wait_for(bridge.attached.wait(), timeout=60)
        assert bridge.engine_build_id
        limits = bpb.LegLimits(deadline_ms=20000, memory_limit_bytes=64 << 20, max_pending_tool_calls=4, reply_inbox_bytes=1 << 20, max_output_bytes=65536)
        bridge.send(bpb.AttachResponse(start=bpb.Start(run_id="run_tcp", source="return 6 * 7;", limits=limits, catalog_json=json.dumps({"allTools": [], "convenience": {}, "apiFiles": []}))))
        while True:
            msg = await asyncio.wait_for(bridge.inbox.get(), timeout=30)
            assert msg is not None, "the stream ended before the leg did"
            if msg.WhichOneof("message") == "end":
                break
        assert msg.end.WhichOneof("outcome") == "completed" and json.loads(msg.end.completed.value_json) == 42
        await bridge.close()
        assert (await asyncio.to_thread(container.wait, timeout=30))["StatusCode"] == 0  # type: ignore[attr-defined]
    finally:
        await asyncio.to_thread(container.remove, force=True)  # type: ignore[attr-defined]


async def test_the_docker_profile_refuses_the_tcp_bridge(docker_client: docker.DockerClient, listener: BridgeListener) -> None:
    """Without the Kubernetes rule the same cell cannot open an AF_INET socket: the profiles differ in exactly that."""
    bridge = listener.open()
    container = await asyncio.to_thread(_cell, docker_client, listener, bridge.token, profile=json.dumps(DEFAULT_LOCKDOWN.seccomp_profile_for(tcp_bridge=False)))
    try:
        status = (await asyncio.to_thread(container.wait, timeout=60))["StatusCode"]  # type: ignore[attr-defined]
        assert status == 3 and not bridge.attached.is_set()  # the agent's "bridge unreachable" exit
    finally:
        await asyncio.to_thread(container.remove, force=True)  # type: ignore[attr-defined]
        await bridge.close()
