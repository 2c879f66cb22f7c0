"""A real service process: crash recovery, shutdown reporting, bounded logs (issue 11 items 7, 8).

Each test runs ``python -m cellblock.server`` as a child process with real Docker cells
and reads its JSON log lines from stderr.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import grpc
import pytest

from cellblock.client import CellblockClient, InvalidArgumentError, LimitOverrides, Scope, Tool
from cellblock.server.cells import INSTANCE_ID_FILE
from cellblock.server.cells._docker import CELL_LABEL, INSTANCE_LABEL
from cellblock.v1 import code_mode_service_pb2 as cpb
from cellblock.v1 import code_mode_service_pb2_grpc as cpb_grpc
from cellblock.v1 import common_pb2
from tests.integration.conftest import IMAGE
from tests.support.cells import state_dir_in

pytestmark = pytest.mark.asyncio(loop_scope="session")

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServiceProcess:
    """``python -m cellblock.server`` in a child process, its stderr kept in a file."""

    def __init__(self, socket_dir: str, log_path: Path, warm_pool: int = 2) -> None:
        self.address = f"127.0.0.1:{_free_port()}"
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(str(ROOT / p) for p in ("proto", "server", "client")),
            "CELLBLOCK_ADDRESS": self.address,
            "CELLBLOCK_IMAGE": IMAGE,
            "CELLBLOCK_SOCKET_DIR": socket_dir,
            "CELLBLOCK_STATE_DIR": state_dir_in(socket_dir),
            "CELLBLOCK_WARM_POOL": str(warm_pool),
            "CELLBLOCK_CODE_MODE": json.dumps({"enabled": True, "timeoutMs": 20000}),
        }
        self.log_path = log_path
        self._log = log_path.open("ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "cellblock.server"], env=env, stderr=self._log, stdout=subprocess.DEVNULL)  # noqa: S603

    async def ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log_path.read_text()
            try:
                async with grpc.aio.insecure_channel(self.address) as channel:
                    await asyncio.wait_for(channel.channel_ready(), timeout=1)
                    return
            except (TimeoutError, grpc.aio.AioRpcError):
                await asyncio.sleep(0.2)
        raise AssertionError("service did not start: " + self.log_path.read_text()[-2000:])

    def records(self) -> list[dict[str, Any]]:
        out = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue
        return out

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=60)
        finally:
            self._log.close()


@pytest.fixture
def dirs() -> Iterator[tuple[str, Path]]:
    with tempfile.TemporaryDirectory(prefix="cellblock-instance-") as d:
        sockets = os.path.join(d, "sockets")
        os.mkdir(sockets)
        yield sockets, Path(d)


def _cells(client: docker.DockerClient, instance: str) -> list[Any]:
    return client.containers.list(all=True, sparse=True, filters={"label": f"{INSTANCE_LABEL}={instance}"})


async def test_a_restart_after_sigkill_removes_its_own_orphans_and_no_one_elses(docker_client: docker.DockerClient, dirs: tuple[str, Path]) -> None:
    sockets, base = dirs
    foreign = docker_client.containers.create(IMAGE, command=["true"], labels={CELL_LABEL: "foreign", INSTANCE_LABEL: "0123456789abcdef"})
    try:
        first = ServiceProcess(sockets, base / "first.log", warm_pool=2)
        await first.ready()
        instance = (Path(state_dir_in(sockets)) / INSTANCE_ID_FILE).read_text().strip()
        deadline = time.monotonic() + 60
        while len(_cells(docker_client, instance)) < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.5)
        assert len(_cells(docker_client, instance)) >= 2, "the warm pool started no cells"
        first.stop(signal.SIGKILL)
        orphans = {c.id for c in _cells(docker_client, instance)}
        assert orphans and [n for n in os.listdir(sockets) if n.startswith("cell-")], "SIGKILL left nothing to recover"

        second = ServiceProcess(sockets, base / "second.log", warm_pool=0)
        try:
            await second.ready()
            assert (Path(state_dir_in(sockets)) / INSTANCE_ID_FILE).read_text().strip() == instance, "the instance id is stable"
            assert not orphans & {c.id for c in _cells(docker_client, instance)}, "orphans survived the restart"
            assert [n for n in os.listdir(sockets) if n.startswith("cell-")] == []
            foreign.reload()
            assert foreign.status == "created", "another instance's cell was touched"
            removed = [r for r in second.records() if r.get("event") == "server.orphans_removed"]
            assert removed and removed[0]["cells"] == len(orphans), second.records()[-5:]
        finally:
            assert second.stop() == 0
    finally:
        foreign.remove(force=True)


async def test_sigterm_reports_running_legs_as_aborted_by_shutdown(dirs: tuple[str, Path]) -> None:
    sockets, base = dirs
    svc = ServiceProcess(sockets, base / "svc.log", warm_pool=0)
    await svc.ready()
    try:
        async with await CellblockClient.connect(svc.address) as client:
            scope = Scope("shutdown", "shutdown")
            await client.put_catalog(scope, [Tool(source="host", name="noop")])
            leg = asyncio.ensure_future(client.exec(scope, tool_call_id="long", code="while (true) {}", handlers={}))
            await asyncio.sleep(3)
            svc.proc.send_signal(signal.SIGTERM)
            result = await asyncio.wait_for(leg, timeout=30)
        assert (result.status, result.code) == ("failed", "aborted"), result.raw_json
        assert result.error == "execution aborted because this cellblock service is shutting down; the cell was stopped and this run cannot be resumed."
    finally:
        assert svc.stop() == 0


async def test_long_ids_are_refused_and_repeated_warnings_are_counted(dirs: tuple[str, Path]) -> None:
    sockets, base = dirs
    svc = ServiceProcess(sockets, base / "svc.log", warm_pool=0)
    await svc.ready()
    try:
        async with await CellblockClient.connect(svc.address) as client:
            scope = Scope("ids", "ids")
            await client.put_catalog(scope, [Tool(source="host", name="noop")])
            with pytest.raises(InvalidArgumentError, match="start.tool_call_id is longer than 256 characters"):
                await client.exec(scope, tool_call_id="x" * 5_000_000, code="return 1", handlers={})
            with pytest.raises(InvalidArgumentError, match="run_id is longer than 256 characters"):
                await client.get_run(scope, "r" * 100_000)
            async with grpc.aio.insecure_channel(svc.address, options=[("grpc.max_send_message_length", 64 << 20)]) as channel:
                start = cpb.ExecStart(scope=common_pb2.Scope(session_id="ids", agent_run_id="ids"), tool_call_id="t", turn_id="u" * 1000, arguments_json='{"code":"return 1"}')

                async def requests() -> Any:
                    yield cpb.ExecRequest(start=start)

                with pytest.raises(grpc.aio.AioRpcError) as raised:
                    async for _ in cpb_grpc.CodeModeServiceStub(channel).Exec(requests()):
                        pass
                assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "turn_id" in (raised.value.details() or "")
            # Up to 600 calls of an unknown tool: each host rejection is a warning; the leg writes 20 and a count.
            code = "for (let i = 0; i < 600; i++) { try { await tools.callValue('nope', {}); } catch (e) {} } return 'done';"
            result = await client.exec(scope, tool_call_id="storm", code=code, handlers={}, limits=LimitOverrides(timeout_ms=20000))
            assert result.status in ("completed", "waiting"), result.raw_json  # a slow machine parks the rest
            rejected = json.loads(result.raw_json)["telemetry"]["callCount"]
            assert rejected >= 100, result.raw_json
    finally:
        assert svc.stop() == 0
    records = svc.records()
    assert not any(len(json.dumps(r)) > 20_000 for r in records), "an id reached the log in full"
    storm = [r for r in records if r.get("tool_call_id") == "storm"]
    by_event: dict[str, int] = {}
    for r in storm:
        by_event[r["event"]] = by_event.get(r["event"], 0) + 1
    assert all(n <= 25 for e, n in by_event.items() if e != "rpc.completed"), by_event
    completed = [r for r in storm if r["event"] == "rpc.completed"]
    assert completed, storm[-3:]
    assert by_event.get("bridge.rejected", 0) >= 20, by_event
    assert completed[-1].get("repeats_suppressed", 0) >= rejected - 25, (rejected, completed[-1])


async def test_a_second_service_on_the_same_directories_exits_with_one_line(dirs: tuple[str, Path]) -> None:
    # `make serve` twice: the second instance finds the first's lock and must say so in one line, no traceback.
    sockets, base = dirs
    first = ServiceProcess(sockets, base / "first.log", warm_pool=0)
    try:
        await first.ready()
        second = ServiceProcess(sockets, base / "second.log", warm_pool=0)
        code = await asyncio.to_thread(second.proc.wait, 60)
        second.stop()
        text = (base / "second.log").read_text(errors="replace")
        lines = [line for line in text.splitlines() if not line.startswith("{")]
        assert code == 1, text
        assert lines == [f"cellblock: another cellblock instance is using {sockets}; give each instance its own CELLBLOCK_SOCKET_DIR and CELLBLOCK_STATE_DIR"], text
        assert "Traceback" not in text
        async with grpc.aio.insecure_channel(first.address) as channel:  # the first one still serves
            await asyncio.wait_for(channel.channel_ready(), timeout=5)
    finally:
        assert first.stop() == 0
