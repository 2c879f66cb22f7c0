"""The host holds no more of a cell's snapshot than ``maxSnapshotBytes`` (issue 11 item 4, SPEC §10.4).

A hostile guest agent (``tests/support/snapshot_flood_guest.py``) in a real locked-down cell
streams snapshot chunks: unasked for (no ``suspend``), which is an invalid cell response [R17]
at once, or after a real ``suspend``, far past ``maxSnapshotBytes``, which is [R14] with every
byte counted but none past the limit kept. Before, the host kept every chunk until the leg's
end: 300 MiB of chunks grew the service by 300 MiB.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from cellblock.client import CellblockClient, LimitOverrides, Scope, Tool
from cellblock.server import messages as msg
from cellblock.server.app import ServerSettings, Service, start_service
from cellblock.server.cells import DockerExecutor, DockerExecutorConfig
from tests.integration.conftest import IMAGE
from tests.support.cells import cell_dirs, state_dir_in

pytestmark = pytest.mark.asyncio(loop_scope="session")

SUPPORT = Path(__file__).resolve().parents[1] / "support"
MIB = 1024 * 1024
FLOOD_MIB = 200


def _peak_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


@pytest_asyncio.fixture(loop_scope="session")
async def flood(docker_client: Any) -> AsyncIterator[tuple[Service, Path]]:
    with tempfile.TemporaryDirectory(prefix="cellblock-flood-") as base:
        sockets, data = Path(base) / "sockets", Path(base) / "data"
        sockets.mkdir()
        data.mkdir()
        data.chmod(0o755)
        config = DockerExecutorConfig(
            image=IMAGE, test_guest_command=("python3", "-s", "-P", "/flood/snapshot_flood_guest.py"), test_mounts={str(SUPPORT): "/flood", str(data): "/flood-data"}
        )
        settings = ServerSettings(address="127.0.0.1:0", image=IMAGE, code_mode={"enabled": True}, socket_dir=str(sockets), state_dir=state_dir_in(str(sockets)), warm_pool=0)
        svc = await start_service(settings, executor=DockerExecutor(config))
        try:
            yield svc, data
        finally:
            await svc.stop()
        assert svc.executor.list_cell_containers() == []  # type: ignore[attr-defined]
        assert cell_dirs(str(sockets)) == []


async def _exec(svc: Service, data: Path, mode: str) -> tuple[Any, float, float]:
    mode_file = data / "mode"
    mode_file.write_text(f"{mode} {FLOOD_MIB}")
    mode_file.chmod(0o644)
    async with await CellblockClient.connect(svc.address) as client:
        scope = Scope(f"flood-{mode}", "flood")
        await client.put_catalog(scope, [Tool(source="host", owner="core", name="noop")])
        before = _rss_mib()
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
        started = time.monotonic()
        result = await client.exec(scope, tool_call_id="flood", code="return 1", handlers={}, limits=LimitOverrides(timeout_ms=8000, max_snapshot_bytes=MIB))
        elapsed = time.monotonic() - started
        assert (await client.list_runs(scope)).runs == []
    return result, elapsed, _peak_mib() - before


async def test_snapshot_chunks_the_host_never_asked_for_end_the_leg_as_an_invalid_response(flood: tuple[Service, Path]) -> None:
    result, elapsed, grown = await _exec(*flood, "unrequested")
    assert (result.status, result.code, result.failure_phase) == ("failed", "internal_error", "host"), result.raw_json
    assert result.error == msg.R17
    assert elapsed < 8, f"the leg waited for its deadline ({elapsed:.1f} s)"
    assert grown < FLOOD_MIB / 2, f"the service grew by {grown:.0f} MiB for {FLOOD_MIB} MiB of unasked-for chunks"


async def test_a_snapshot_past_max_snapshot_bytes_is_counted_not_kept(flood: tuple[Service, Path]) -> None:
    result, _, grown = await _exec(*flood, "requested")
    assert (result.status, result.code, result.failure_phase) == ("failed", "snapshot_limit_exceeded", "host"), result.raw_json
    assert result.error == msg.r14(FLOOD_MIB * MIB, MIB)
    assert grown < FLOOD_MIB / 2, f"the service grew by {grown:.0f} MiB holding a {FLOOD_MIB} MiB snapshot over a 1 MiB limit"
