"""A real cellblock service in its own process (``python -m cellblock.server``), for restart tests.

The process is configured only through ``CELLBLOCK_*`` variables, as an operator
would run it. :meth:`ServiceProcess.kill` is a real SIGKILL: nothing of the
service gets to run afterwards.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any

import docker
import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.support.cells import IMAGE, state_dir_in

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServiceProcess:
    """One service process on a fixed address and store.

    Args:
        store: ``CELLBLOCK_STORE``.
        socket_dir: ``CELLBLOCK_SOCKET_DIR`` (cells of this process mount sockets from it).
        port: Listen port on 127.0.0.1 (a restarted service reuses its predecessor's).
        code_mode: ``CELLBLOCK_CODE_MODE``.
        env: Further ``CELLBLOCK_*`` settings.
    """

    def __init__(self, store: str, socket_dir: str, port: int | None = None, code_mode: dict[str, Any] | None = None, env: dict[str, str] | None = None) -> None:
        self.store = store
        self.socket_dir = socket_dir
        # The instance's own state directory (its instance id): a restart on the same socket
        # directory is the same instance; replicas need their own socket directories.
        self.state_dir = state_dir_in(socket_dir)
        self.port = port or free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.code_mode = code_mode or {"enabled": True, "timeoutMs": 8000}
        self.env = env or {}
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = tempfile.mkstemp(prefix="cellblock-service-", suffix=".log")[1]

    def start(self, timeout: float = 60.0) -> ServiceProcess:
        """Starts the process and waits until gRPC health answers SERVING."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("CELLBLOCK_")}
        env.update(
            PYTHONPATH=os.pathsep.join(os.path.join(_REPO, p) for p in ("proto", "server", "client", "sandbox-image/guest")),
            CELLBLOCK_ADDRESS=self.address,
            CELLBLOCK_STORE=self.store,
            CELLBLOCK_SOCKET_DIR=self.socket_dir,
            CELLBLOCK_STATE_DIR=self.state_dir,
            CELLBLOCK_IMAGE=IMAGE,
            CELLBLOCK_EXECUTOR="docker",
            CELLBLOCK_WARM_POOL="0",
            CELLBLOCK_CODE_MODE=json.dumps(self.code_mode),
            **self.env,
        )
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the child
        self.proc = subprocess.Popen([sys.executable, "-m", "cellblock.server"], env=env, stdout=log, stderr=subprocess.STDOUT, cwd=_REPO)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the service exited with {self.proc.returncode}: {self.log_tail()}")
            if self._serving():
                return self
            time.sleep(0.2)
        self.kill()
        raise RuntimeError(f"the service did not become healthy in {timeout} s: {self.log_tail()}")

    def _serving(self) -> bool:
        with grpc.insecure_channel(self.address) as channel:
            try:
                reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=1.0)
            except grpc.RpcError:
                return False
            return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)

    def kill(self) -> None:
        """SIGKILL: the service gets no chance to clean up or store anything."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        """SIGTERM and wait (a graceful stop)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()

    def log_tail(self, chars: int = 3000) -> str:
        """The end of the process's log."""
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")[-chars:]

    def close(self) -> None:
        """Stops the process and removes its log."""
        self.stop()
        os.unlink(self.log_path)


def remove_cells_of(socket_dir: str) -> int:
    """Removes cell containers whose bridge sockets come from ``socket_dir`` (left by a killed service).

    Returns:
        How many were removed.
    """
    client = docker.from_env()
    removed = 0
    try:
        # Sparse: the list call's own fields (Mounts included), no inspect racing other removals.
        for c in client.containers.list(all=True, sparse=True, filters={"label": "io.cellblock.cell"}):
            if any(str(m.get("Source", "")).startswith(socket_dir) for m in c.attrs.get("Mounts", []) or []):
                try:
                    client.api.remove_container(c.id, force=True)
                    removed += 1
                except docker.errors.NotFound:
                    pass  # gone already (the cell exited and was auto-removed)
                except docker.errors.APIError as exc:
                    if exc.status_code != 409:  # 409: its removal is already in progress
                        raise
    finally:
        client.close()
    return removed
