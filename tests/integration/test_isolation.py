"""The cell container's lockdown, probed from inside by a test-only command.

JavaScript in a cell has no socket, file or process API at all, so these
probes run Python inside a container created with exactly the executor's
options (`container_options`), replacing only the command.
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

import docker
import pytest

from cellblock.server.cells import CellSpec, DockerExecutorConfig, container_options
from tests.support.cells import IMAGE, OCI_RUNTIME, leg_cells

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
for key, path in (("rootfs", "/etc/evil"), ("tmp", "/tmp/evil"), ("shm", "/dev/shm/evil")):
    try:
        open(path, "w").write("x"); out[key] = "writable"
    except OSError as e:
        out[key] = e.errno
out["docker_sock"] = os.path.exists("/var/run/docker.sock")
out["env"] = sorted(os.environ)
out["mounts"] = [l.split()[1] for l in open("/proc/self/mounts") if l.split()[1].startswith("/run/cellblock")]
out["etc_mounts"] = sorted(l.split()[1] for l in open("/proc/self/mounts") if l.split()[1].startswith("/etc/"))
out["net_ns"] = os.readlink("/proc/self/ns/net")
out["interfaces"] = sorted(os.listdir("/sys/class/net"))
print(json.dumps(out))
"""


def test_cell_container_lockdown(docker_client: docker.DockerClient) -> None:
    with tempfile.TemporaryDirectory() as bridge_dir:
        spec = CellSpec(cell_id="cell_probe", bridge_dir=bridge_dir, cell_token="t" * 64, memory_limit_bytes=64 << 20)
        config = DockerExecutorConfig(image=IMAGE, runtime=OCI_RUNTIME)
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
    if OCI_RUNTIME != "runsc":
        assert out["inet_socket"] == 1, "seccomp must refuse AF_INET sockets with EPERM"
    # Under runsc the cell's allow-list is not loaded (scripts/ensure-runsc.sh: this runsc ignores
    # errnoRet, so --oci-seccomp stops every thread); gVisor's netstack has no interface, so the
    # connection above still fails.
    # runsc checks permissions before the read-only mount (EACCES); /tmp is world-writable, so only
    # a read-only mount can stop that write (gVisor would otherwise add a writable tmpfs there).
    assert out["rootfs"] in (13, 30), "the root file system must not be writable"
    assert out["tmp"] == 30, "/tmp must be read-only (EROFS)"
    assert out["shm"] in (2, 13), "/dev/shm must not exist (ipc none)"
    assert out["docker_sock"] is False
    assert set(out["env"]) <= {"PATH", "PYTHONPATH", "PYTHONDONTWRITEBYTECODE", "PYTHONUNBUFFERED", "HOME", "HOSTNAME", "PYTHONNOUSERSITE", "CELLBLOCK_PRECOMPILED_QUICKJS", "CELLBLOCK_BRIDGE_SOCKET", "CELLBLOCK_CELL_TOKEN", "CELLBLOCK_MEMORY_LIMIT_BYTES", "LANG"}
    assert out["mounts"] == ["/run/cellblock"]
    # A network namespace of its own with nothing but loopback, and no engine network
    # sandbox: no hosts or resolv.conf file of the engine's is mounted into the cell.
    assert out["net_ns"] != os.readlink("/proc/self/ns/net")
    assert set(out["interfaces"]) <= {"lo"}
    assert "/etc/resolv.conf" not in out["etc_mounts"] and "/etc/hosts" not in out["etc_mounts"]


def test_container_options_lock_everything_down() -> None:
    spec = CellSpec(cell_id="cell_x", bridge_dir="/tmp/x", cell_token="t", memory_limit_bytes=64 << 20)
    opts = container_options(DockerExecutorConfig(), spec, "{}")
    assert opts["network_mode"] == "none"
    assert opts["network_disabled"] is True
    assert opts["read_only"] is True
    assert opts["cap_drop"] == ["ALL"]
    assert "no-new-privileges:true" in opts["security_opt"]
    assert any(o.startswith("seccomp=") for o in opts["security_opt"])
    assert opts["user"] != "0" and not opts["user"].startswith("0:")
    assert opts["mem_limit"] == opts["memswap_limit"]
    assert opts["pids_limit"] > 0 and opts["nano_cpus"] > 0
    assert list(opts["volumes"]) == ["/tmp/x"]
    assert set(opts["environment"]) == {"CELLBLOCK_BRIDGE_SOCKET", "CELLBLOCK_CELL_TOKEN", "CELLBLOCK_MEMORY_LIMIT_BYTES"}


@pytest.mark.parametrize("runtime", ["runsc-missing-runtime"])
def test_missing_oci_runtime_fails_closed(runtime: str) -> None:
    import asyncio

    from cellblock.server.cells import CellStartError, DockerExecutor

    executor = DockerExecutor(DockerExecutorConfig(runtime=runtime))
    with pytest.raises(CellStartError, match="not configured"):
        asyncio.run(executor.check())


@pytest.mark.asyncio(loop_scope="session")
async def test_the_cell_of_a_real_exec_is_locked_down(client: Any, scope: Any, service: Any, docker_client: docker.DockerClient) -> None:
    """Inspects the container the executor really started for an exec."""
    import asyncio

    from cellblock.client import LimitOverrides, Tool

    os.environ["CELLBLOCK_TEST_HOST_SECRET"] = "must-not-reach-the-cell"
    try:
        await client.put_catalog(scope, [Tool(source="host", name="noop")])
        task = asyncio.ensure_future(client.exec(scope, tool_call_id="inspect", code="while (true) {}", handlers={}, limits=LimitOverrides(timeout_ms=6000)))
        names: list[str] = []
        for _ in range(50):
            names = leg_cells(service)
            if names:
                break
            await asyncio.sleep(0.1)
        assert len(names) == 1
        attrs = docker_client.containers.get(names[0]).attrs
        result = await task
    finally:
        del os.environ["CELLBLOCK_TEST_HOST_SECRET"]
    assert result.code == "timeout"
    host = attrs["HostConfig"]
    assert host["NetworkMode"] == "none"
    # No libnetwork sandbox (its prestart hook starts the whole dockerd binary per cell).
    assert attrs["Config"]["NetworkDisabled"] is True
    assert not attrs["NetworkSettings"]["SandboxKey"] and not attrs["NetworkSettings"]["Networks"]
    assert host["ReadonlyRootfs"] is True
    assert host["CapDrop"] == ["ALL"] and not host.get("CapAdd")
    assert "no-new-privileges:true" in host["SecurityOpt"]
    assert any(o.startswith("seccomp=") and '"defaultAction":"SCMP_ACT_ERRNO"' in o for o in host["SecurityOpt"])
    assert host["PidsLimit"] > 0 and host["NanoCpus"] > 0
    assert host["Memory"] > 0 and host["MemorySwap"] == host["Memory"]
    assert host["IpcMode"] == "none" and host["Privileged"] is False
    assert not host.get("Devices")
    assert [m["Destination"] for m in attrs["Mounts"]] == ["/run/cellblock"]
    assert attrs["Config"]["User"] == "65532:65532"
    env_names = {e.split("=", 1)[0] for e in attrs["Config"]["Env"]}
    assert "CELLBLOCK_TEST_HOST_SECRET" not in env_names
    assert not any("must-not-reach-the-cell" in e for e in attrs["Config"]["Env"])
    # Only the image's own ENV lines (LANG comes from the debootstrap base) and the two bridge variables.
    assert env_names <= {"PATH", "LANG", "PYTHONPATH", "PYTHONDONTWRITEBYTECODE", "PYTHONUNBUFFERED", "PYTHONNOUSERSITE", "CELLBLOCK_PRECOMPILED_QUICKJS", "CELLBLOCK_BRIDGE_SOCKET", "CELLBLOCK_CELL_TOKEN", "CELLBLOCK_MEMORY_LIMIT_BYTES"}


BOMB = r"""
import json, os, threading, time
out = {}
for path in ("/tmp/x", "/opt/cellblock/app/x", "/run/x", "/home/x", "/dev/shm/x"):
    try:
        open(path, "w").write("x"); out[path] = "written"
    except OSError as e:
        out[path] = e.errno
print(json.dumps(out), flush=True)
try:
    if os.fork() == 0:
        os._exit(0)
    out["fork"] = "forked"
except OSError as e:
    out["fork"] = e.errno
threads = []
try:
    for _ in range(10000):
        t = threading.Thread(target=time.sleep, args=(30,), daemon=True); t.start(); threads.append(t)
    out["threads"] = "unbounded"
except RuntimeError:
    out["threads"] = len(threads)
print(json.dumps(out), flush=True)
os._exit(0)
"""


def test_fork_and_thread_bombs_and_file_writes_are_stopped(docker_client: docker.DockerClient) -> None:
    """A test-only command inside a cell container (not JavaScript, which has no such API)."""
    with tempfile.TemporaryDirectory() as bridge_dir:
        spec = CellSpec(cell_id="cell_bomb", bridge_dir=bridge_dir, cell_token="t" * 64, memory_limit_bytes=64 << 20)
        config = DockerExecutorConfig(image=IMAGE, runtime=OCI_RUNTIME)
        options = container_options(config, spec, json.dumps(json.loads(config.seccomp_profile.read_text())))
        options["name"] = f"cellblock-bomb-{os.getpid()}"
        container = docker_client.containers.create(**options, entrypoint=["python3", "-c", BOMB])
        try:
            container.start()
            status = container.wait(timeout=120)["StatusCode"]
            lines = container.logs(stdout=True, stderr=False).decode().strip().splitlines()
        finally:
            container.remove(force=True)
    out = json.loads(lines[-1])
    for path in ("/tmp/x", "/opt/cellblock/app/x", "/run/x", "/home/x", "/dev/shm/x"):
        assert out[path] in (13, 30, 2), f"{path} was writable"  # EACCES, EROFS or ENOENT: never written
    if OCI_RUNTIME == "runsc":
        # gVisor runs guest threads inside its Sentry, where the host pids cgroup does not count them,
        # and the allow-list is not loaded (see above): fork works and the thread bomb is stopped by
        # the container's memory limit (the cgroup kills the sandbox, 137) instead.
        assert status == 137 and len(lines) == 1, "under runsc the memory limit must end the thread bomb"
        return
    assert status == 0
    assert out["fork"] == 1, "fork must be refused (EPERM by the seccomp profile)"
    assert isinstance(out["threads"], int) and out["threads"] < config.pids_limit, "the pids limit must stop a thread bomb"


@pytest.mark.skipif(OCI_RUNTIME == "runsc", reason="the self-test checks the profile under runc; runsc does not load it (scripts/ensure-runsc.sh)")
def test_seccomp_profile_self_test(docker_client: docker.DockerClient) -> None:
    """sandbox-image/seccomp-selftest.py: what the agent needs works; what the profile removes gets EPERM."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, str(root / "sandbox-image" / "seccomp-selftest.py")], capture_output=True, text=True, timeout=300, cwd=root)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "checks passed" in proc.stdout
