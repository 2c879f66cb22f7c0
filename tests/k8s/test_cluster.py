"""The k8s tier: cellblock on a real cluster (``make test-k8s``; k8s/README.md, "Testing on a cluster").

Needs ``KUBECONFIG`` naming a cluster whose nodes have the images ``cellblock-cell:dev`` and
``cellblock-control:dev`` and where ``k8s/overlays/postgres`` (several replicas on PostgreSQL)
or ``k8s/overlays/dev`` (one replica; the two-replica test then skips) is applied. Skips, with
that message, when ``KUBECONFIG`` is unset. Clients reach replicas with ``kubectl port-forward``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from cellblock.client import CellblockClient, LimitOverrides, Scope, Tool
from cellblock.server.cells import CellSpec, KubernetesExecutorConfig, pod_manifest

pytestmark = [
    pytest.mark.k8s,
    pytest.mark.skipif(not os.environ.get("KUBECONFIG"), reason="the k8s tier needs KUBECONFIG naming a cluster with cellblock applied (k8s/README.md)"),
    pytest.mark.asyncio(loop_scope="session"),
    pytest.mark.timeout(600),
]
SYSTEM, CELLS = "cellblock-system", "cellblock-cells"


def kubectl(*args: str, check: bool = True, timeout: float = 120) -> str:
    binary = str(Path(sys.executable).parent / "kubectl") if (Path(sys.executable).parent / "kubectl").exists() else (shutil.which("kubectl") or "kubectl")
    proc = subprocess.run([binary, *args], capture_output=True, text=True, timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)}: {proc.stderr.strip()}")
    return proc.stdout


def replicas() -> list[str]:
    out = json.loads(kubectl("-n", SYSTEM, "get", "pods", "-l", "app.kubernetes.io/name=cellblock-control", "-o", "json"))
    ready = [p for p in out["items"] if p["status"].get("phase") == "Running" and p["metadata"].get("deletionTimestamp") is None and all(c.get("ready") for c in p["status"].get("containerStatuses", []))]
    return sorted(p["metadata"]["name"] for p in ready)


def cell_pods(replica: str | None = None) -> list[str]:
    selector = "app.kubernetes.io/name=cellblock-cell" + (f",io.cellblock.replica={replica}" if replica else "")
    return kubectl("-n", CELLS, "get", "pods", "-l", selector, "-o", "name").split()


@contextlib.contextmanager
def port_forward(target: str) -> Iterator[str]:
    """``kubectl port-forward`` to a replica (``pod/<name>``) or the Service; yields ``127.0.0.1:<port>``."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    binary = str(Path(sys.executable).parent / "kubectl") if (Path(sys.executable).parent / "kubectl").exists() else "kubectl"
    proc = subprocess.Popen([binary, "-n", SYSTEM, "port-forward", target, f"{port}:50051"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            time.sleep(0.2)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest_asyncio.fixture(loop_scope="session")
async def client() -> AsyncIterator[CellblockClient]:
    assert replicas(), "no ready cellblock-control replica in cellblock-system"
    with port_forward("svc/cellblock-control") as address:
        async with await CellblockClient.connect(address) as c:
            yield c


def _scope() -> Scope:
    n = secrets.token_hex(4)
    return Scope(session_id=f"k8s-tier-{n}", agent_run_id=f"agent-{n}")


async def echo(tool_input: dict[str, Any], call: Any) -> dict[str, Any]:
    return tool_input


async def test_main_job_runs_in_a_cell_pod(client: CellblockClient) -> None:
    scope = _scope()
    await client.put_catalog(scope, [Tool(source="host", name="echo")])
    result = await client.exec(scope, tool_call_id="main", code="const r = await tools.echo({n: 20}); console.log('hi'); return r.n * 2 + 2;", handlers={"echo": echo})
    assert result.status == "completed" and result.value == 42, result.raw_json


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("while (true) {}", "timeout"),
        ("const a = []; while (true) a.push('x'.repeat(1 << 20));", "runtime_unavailable"),
        ("function f() { return f(); } f();", None),
    ],
)
async def test_hostile_programs_end_and_the_service_stays_healthy(client: CellblockClient, code: str, expected: str | None) -> None:
    scope = _scope()
    await client.put_catalog(scope, [Tool(source="host", name="echo")])
    result = await client.exec(scope, tool_call_id="hostile", code=code, handlers={}, limits=LimitOverrides(timeout_ms=3000))
    assert result.status == "failed"
    if expected:
        assert result.code == expected, result.raw_json
    after = await client.exec(scope, tool_call_id="after", code="return 1;", handlers={})
    assert after.value == 1


async def test_suspend_on_one_replica_resume_on_another() -> None:
    names = replicas()
    if len(names) < 2:
        pytest.skip("needs two replicas on a shared PostgreSQL run store (k8s/overlays/postgres)")
    scope = _scope()
    with port_forward(f"pod/{names[0]}") as first_address, port_forward(f"pod/{names[1]}") as second_address:
        async with await CellblockClient.connect(first_address) as first:
            await first.put_catalog(scope, [Tool(source="host", name="echo")])
            parked = await first.exec(scope, tool_call_id="park", code='const y = await yield_control("decide"); return y;', handlers={})
            assert parked.status == "waiting" and parked.run_id
        async with await CellblockClient.connect(second_address) as second:
            await second.put_catalog(scope, [Tool(source="host", name="echo")])
            done = await second.wait(scope, tool_call_id="resume", run_id=parked.run_id)
    assert done.status == "completed" and done.value == {"status": "yielded", "reason": "decide"}, done.raw_json


async def test_a_deleted_replicas_cell_pods_are_removed() -> None:
    names = replicas()
    victim = names[0]
    scope = _scope()
    with port_forward(f"pod/{victim}") as address:
        async with await CellblockClient.connect(address) as c:
            await c.put_catalog(scope, [Tool(source="host", name="echo")])
            task = asyncio.ensure_future(c.exec(scope, tool_call_id="doomed", code="while (true) {}", handlers={}, limits=LimitOverrides(timeout_ms=60000)))
            for _ in range(100):
                if cell_pods(victim):
                    break
                await asyncio.sleep(0.3)
            assert cell_pods(victim), "the leg's cell pod did not appear"
            kubectl("-n", SYSTEM, "delete", "pod", victim, "--grace-period=0", "--force", "--wait=false")
            with contextlib.suppress(Exception):
                await asyncio.wait_for(task, timeout=30)
    # Another replica (or the victim's replacement at start) sweeps them; activeDeadlineSeconds is the backstop.
    deadline = time.monotonic() + 180
    while cell_pods(victim) and time.monotonic() < deadline:
        await asyncio.sleep(2)
    assert cell_pods(victim) == [], "the dead replica's cell pods are still there"


PROBE = r"""
import json, socket
out = {}
for name, addr in (("dns", ("1.1.1.1", 53)), ("api", ("kubernetes.default.svc", 443)), ("bridge", (BRIDGE_HOST, 50052))):
    try:
        socket.create_connection(addr, timeout=3).close(); out[name] = "connected"
    except OSError as e:
        out[name] = type(e).__name__
print(json.dumps(out))
"""


async def test_a_cell_pods_egress_is_refused_except_to_the_bridge_port() -> None:
    """A pod built exactly like a cell (pod_manifest) with a test-only command: only the bridge port answers."""
    (replica, *_) = replicas()
    pod_ip = json.loads(kubectl("-n", SYSTEM, "get", "pod", replica, "-o", "json"))["status"]["podIP"]
    spec = CellSpec(cell_id="cell_" + secrets.token_hex(8), bridge_dir="", cell_token="t" * 64, memory_limit_bytes=64 << 20)
    body = pod_manifest(KubernetesExecutorConfig(namespace=CELLS, image_pull_policy="IfNotPresent"), spec, bridge_address=f"{pod_ip}:50052", instance_id="k8s-tier-probe")
    body["spec"]["containers"][0]["command"] = ["python3", "-c", PROBE.replace("BRIDGE_HOST", repr(pod_ip))]
    name = body["metadata"]["name"]
    path = Path(os.environ.get("TMPDIR", "/tmp")) / f"{name}.json"
    path.write_text(json.dumps(body))
    kubectl("-n", CELLS, "create", "-f", str(path))
    try:
        deadline = time.monotonic() + 120
        phase = ""
        while time.monotonic() < deadline:
            phase = kubectl("-n", CELLS, "get", "pod", name, "-o", "jsonpath={.status.phase}")
            if phase in ("Succeeded", "Failed"):
                break
            await asyncio.sleep(1)
        out = json.loads(kubectl("-n", CELLS, "logs", name).strip().splitlines()[-1])
    finally:
        kubectl("-n", CELLS, "delete", "pod", name, "--grace-period=0", "--force", check=False)
        path.unlink(missing_ok=True)
    assert out["dns"] != "connected" and out["api"] != "connected", out
    assert out["bridge"] == "connected", out
