"""The cell container's lockdown, probed from inside by a test-only command.

JavaScript in a cell has no socket, file or process API at all, so these
probes run Python inside a container created with exactly the executor's
options (`container_options`), replacing only the command.
"""

from __future__ import annotations

import json
import os
import tempfile

import docker
import pytest

from cellblock.server.executors import CellSpec, DockerExecutorConfig, container_options

PROBE = r"""
import json, os, socket
out = {"uid": os.getuid()}
try:
    socket.create_connection(("1.1.1.1", 53), timeout=2); out["net"] = "connected"
except OSError as e:
    out["net"] = type(e).__name__
try:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM); out["inet_socket"] = "created"; s.close()
except OSError as e:
    out["inet_socket"] = e.errno
try:
    open("/etc/evil", "w").write("x"); out["rootfs"] = "writable"
except OSError as e:
    out["rootfs"] = e.errno
out["docker_sock"] = os.path.exists("/var/run/docker.sock")
out["env"] = sorted(os.environ)
out["mounts"] = [l.split()[1] for l in open("/proc/self/mounts") if l.split()[1].startswith("/run/cellblock")]
print(json.dumps(out))
"""


def test_cell_container_lockdown(docker_client: docker.DockerClient) -> None:
    with tempfile.TemporaryDirectory() as bridge_dir:
        spec = CellSpec(cell_id="cell_probe", bridge_dir=bridge_dir, cell_token="t" * 64, memory_limit_bytes=64 << 20)
        config = DockerExecutorConfig()
        profile = config.seccomp_profile.read_text()
        options = container_options(config, spec, json.dumps(json.loads(profile)))
        options["detach"] = True
        options["name"] = f"cellblock-probe-{os.getpid()}"
        container = docker_client.containers.create(**options, entrypoint=["python3", "-c", PROBE])
        try:
            container.start()
            assert container.wait(timeout=60)["StatusCode"] == 0
            out = json.loads(container.logs(stdout=True, stderr=False).decode().strip().splitlines()[-1])
        finally:
            container.remove(force=True)
    assert out["uid"] != 0
    assert out["net"] in ("OSError", "PermissionError", "ConnectionRefusedError") or out["net"].endswith("Error")
    assert out["net"] != "connected"
    assert out["inet_socket"] == 1, "seccomp must refuse AF_INET sockets with EPERM"
    assert out["rootfs"] == 30, "the root file system must be read-only (EROFS)"
    assert out["docker_sock"] is False
    assert set(out["env"]) <= {"PATH", "PYTHONPATH", "PYTHONDONTWRITEBYTECODE", "PYTHONUNBUFFERED", "HOME", "HOSTNAME", "PYTHONNOUSERSITE", "CELLBLOCK_BRIDGE_SOCKET", "CELLBLOCK_CELL_TOKEN", "LANG"}
    assert out["mounts"] == ["/run/cellblock"]


def test_container_options_lock_everything_down() -> None:
    spec = CellSpec(cell_id="cell_x", bridge_dir="/tmp/x", cell_token="t", memory_limit_bytes=64 << 20)
    opts = container_options(DockerExecutorConfig(), spec, "{}")
    assert opts["network_mode"] == "none"
    assert opts["read_only"] is True
    assert opts["cap_drop"] == ["ALL"]
    assert "no-new-privileges:true" in opts["security_opt"]
    assert any(o.startswith("seccomp=") for o in opts["security_opt"])
    assert opts["user"] != "0" and not opts["user"].startswith("0:")
    assert opts["mem_limit"] == opts["memswap_limit"]
    assert opts["pids_limit"] > 0 and opts["nano_cpus"] > 0
    assert list(opts["volumes"]) == ["/tmp/x"]
    assert set(opts["environment"]) == {"CELLBLOCK_BRIDGE_SOCKET", "CELLBLOCK_CELL_TOKEN"}


@pytest.mark.parametrize("runtime", ["runsc-missing-runtime"])
def test_missing_oci_runtime_fails_closed(runtime: str) -> None:
    import asyncio

    from cellblock.server.executors import CellStartError, DockerExecutor

    executor = DockerExecutor(DockerExecutorConfig(runtime=runtime))
    with pytest.raises(CellStartError, match="not configured"):
        asyncio.run(executor.check())
