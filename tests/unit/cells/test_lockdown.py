"""One lockdown, two translations: the Docker create options and the cell pod compared point by point (SPEC §15 item 1, §16.3 item 1)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from cellblock.server.cells import DockerExecutorConfig, KubernetesExecutorConfig, Lockdown, Owner, container_options, pod_manifest
from cellblock.server.cells._lockdown import DEFAULT_LOCKDOWN
from tests.support.k8s_policy import restricted_violations

ROOT = Path(__file__).resolve().parents[3]
SPEC_ARGS: dict[str, Any] = {"cell_id": "cell_0123456789abcdef", "bridge_dir": "/tmp/cell-x", "cell_token": "t" * 64, "memory_limit_bytes": 64 << 20}
# A lockdown with every number changed from the default, so a translation that ignores the
# lockdown (a hard-coded value) fails the comparison.
CUSTOM = Lockdown(pids_limit=33, cpu_millis=750, overhead_memory_bytes=100 << 20, ephemeral_storage_bytes=8 << 20, uid=4242)


def _both(lock: Lockdown) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    from cellblock.server.cells import CellSpec

    spec = CellSpec(**SPEC_ARGS)
    docker = container_options(DockerExecutorConfig(lockdown=lock), spec, "{}")
    pod = pod_manifest(KubernetesExecutorConfig(lockdown=lock), spec, bridge_address="10.0.0.7:50052", instance_id="i")
    return docker, pod, pod["spec"]["containers"][0]


@pytest.mark.parametrize("lock", [DEFAULT_LOCKDOWN, CUSTOM], ids=["default", "custom"])
def test_docker_options_and_pod_spec_express_the_same_lockdown(lock: Lockdown) -> None:
    docker, pod, container = _both(lock)
    spec, csc = pod["spec"], container["securityContext"]
    memory = lock.memory_bytes(SPEC_ARGS["memory_limit_bytes"])
    # non-root uid/gid
    assert docker["user"] == f"{lock.uid}:{lock.uid}"
    assert csc["runAsUser"] == spec["securityContext"]["runAsUser"] == lock.uid
    assert csc["runAsGroup"] == spec["securityContext"]["runAsGroup"] == lock.uid
    assert csc["runAsNonRoot"] is spec["securityContext"]["runAsNonRoot"] is True
    # read-only root, and an empty read-only /tmp
    assert docker["read_only"] is csc["readOnlyRootFilesystem"] is lock.read_only_root is True
    assert docker["tmpfs"] == {"/tmp": "ro,size=4k,mode=1777"}
    assert {"name": "tmp", "mountPath": "/tmp", "readOnly": True} in container["volumeMounts"]
    # capabilities: all dropped, none added
    assert docker["cap_drop"] == csc["capabilities"]["drop"] == ["ALL"]
    assert "cap_add" not in docker and "add" not in csc["capabilities"]
    # no privilege gain, not privileged
    assert "no-new-privileges:true" in docker["security_opt"]
    assert csc["allowPrivilegeEscalation"] is False
    assert docker["privileged"] is csc["privileged"] is False
    # the seccomp profile: Docker gets the file's JSON inline; the pod names the same file under the kubelet root
    assert [o for o in docker["security_opt"] if o.startswith("seccomp=")] == ["seccomp={}"]
    localhost = {"type": "Localhost", "localhostProfile": lock.seccomp_localhost_name}
    assert csc["seccompProfile"] == spec["securityContext"]["seccompProfile"] == localhost
    installed = (ROOT / "k8s" / "base" / "seccomp" / "cellblock-cell.json").read_bytes()
    assert pod["metadata"]["annotations"]["io.cellblock.seccomp-sha256"] == hashlib.sha256(installed).hexdigest()
    # memory (heap + agent overhead; no swap on Docker, none on Kubernetes nodes) and CPU
    assert docker["mem_limit"] == docker["memswap_limit"] == memory
    assert container["resources"]["limits"]["memory"] == container["resources"]["requests"]["memory"] == str(memory)
    assert docker["nano_cpus"] == lock.cpu_millis * 1_000_000
    assert container["resources"]["limits"]["cpu"] == f"{lock.cpu_millis}m"
    assert container["resources"]["limits"]["ephemeral-storage"] == str(lock.ephemeral_storage_bytes)
    # pids: Docker per container; Kubernetes has no pod field (the node's kubelet podPidsLimit, k8s/README.md)
    assert docker["pids_limit"] == lock.pids_limit
    # no host namespaces, private IPC without /dev/shm, no devices
    assert docker["ipc_mode"] == lock.ipc == "none"
    assert spec["hostNetwork"] is spec["hostPID"] is spec["hostIPC"] is False
    assert spec["shareProcessNamespace"] is False
    assert docker["devices"] == [] and "volumeDevices" not in container
    # network: none on Docker; on Kubernetes the pod network, with the NetworkPolicy of k8s/base (tests/unit/k8s)
    assert docker["network_mode"] == "none" and docker["network_disabled"] is True
    assert pod["metadata"]["labels"]["app.kubernetes.io/name"] == "cellblock-cell"
    # no host environment: only the bridge variables and the heap size the VM is prepared for; no service links; no service-account token
    assert set(docker["environment"]) == {"CELLBLOCK_BRIDGE_SOCKET", "CELLBLOCK_CELL_TOKEN", "CELLBLOCK_MEMORY_LIMIT_BYTES"}
    assert [e["name"] for e in container["env"]] == ["CELLBLOCK_BRIDGE_ADDRESS", "CELLBLOCK_CELL_TOKEN", "CELLBLOCK_MEMORY_LIMIT_BYTES"]
    assert all("valueFrom" not in e for e in container["env"])
    assert "envFrom" not in container
    assert spec["enableServiceLinks"] is False and spec["automountServiceAccountToken"] is False
    # the only mounts: the bridge socket directory (Docker) / the empty /tmp (pod); no host paths
    assert list(docker["volumes"]) == [SPEC_ARGS["bridge_dir"]]
    assert [v["name"] for v in spec["volumes"]] == ["tmp"] and all("hostPath" not in v for v in spec["volumes"])
    assert restricted_violations(pod) == []


def test_every_lockdown_field_is_covered_by_the_comparison() -> None:
    """A new lockdown point must be added to the comparison above (and to both translations)."""
    compared = {"uid", "read_only_root", "drop_capabilities", "no_new_privileges", "seccomp_profile", "network", "pids_limit", "cpu_millis", "overhead_memory_bytes", "ephemeral_storage_bytes", "host_environment", "host_namespaces", "devices", "privileged", "read_only_tmp", "ipc"}
    assert set(Lockdown.__dataclass_fields__) == compared


def test_the_pod_takes_runtime_class_deadline_owner_and_tls_from_its_settings() -> None:
    from cellblock.server.cells import CellSpec

    spec = CellSpec(**SPEC_ARGS)
    same_ns = KubernetesExecutorConfig(runtime_class="runsc", active_deadline_s=120, namespace="cells", owner=Owner("replica-0", "cells", "uid-1"), cell_tls_secret="cell-tls")
    pod = pod_manifest(same_ns, spec, bridge_address="10.0.0.7:50052", instance_id="i")
    assert pod["spec"]["runtimeClassName"] == "runsc"
    assert pod["spec"]["activeDeadlineSeconds"] == 120 and pod["spec"]["terminationGracePeriodSeconds"] == 0
    assert pod["metadata"]["ownerReferences"] == [{"apiVersion": "v1", "kind": "Pod", "name": "replica-0", "uid": "uid-1", "controller": False, "blockOwnerDeletion": False}]
    env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
    assert env["CELLBLOCK_BRIDGE_TLS_CA"].endswith("/ca.crt") and env["CELLBLOCK_BRIDGE_TLS_NAME"] == "cellblock-bridge"
    assert restricted_violations(pod) == []
    # Kubernetes ignores an owner in another namespace (and would delete the cell): no reference, a sweep instead.
    other_ns = KubernetesExecutorConfig(owner=Owner("replica-0", "cellblock-system", "uid-1"))
    pod = pod_manifest(other_ns, spec, bridge_address="10.0.0.7:50052", instance_id="i")
    assert "ownerReferences" not in pod["metadata"]
    assert pod["metadata"]["labels"]["io.cellblock.replica"] == "replica-0"
    assert pod["metadata"]["annotations"]["io.cellblock.replica-uid"] == "uid-1"


def test_the_kustomize_base_ships_the_cell_profile_plus_only_the_tcp_bridge_socket_rule() -> None:
    """k8s/base/seccomp/cellblock-cell.json is generated from sandbox-image/seccomp.json (make k8s-profile)."""
    installed = (ROOT / "k8s" / "base" / "seccomp" / "cellblock-cell.json").read_text("utf-8")
    assert installed == DEFAULT_LOCKDOWN.seccomp_text(tcp_bridge=True), "stale: run make k8s-profile"
    docker = json.loads((ROOT / "sandbox-image" / "seccomp.json").read_text("utf-8"))
    k8s = json.loads(installed)
    added = k8s["syscalls"][len(docker["syscalls"]) :]
    assert k8s["syscalls"][: len(docker["syscalls"])] == docker["syscalls"] and {k: v for k, v in k8s.items() if k != "syscalls"} == {k: v for k, v in docker.items() if k != "syscalls"}
    assert [(r["names"], r["args"]) for r in added] == [(["socket"], [{"index": 0, "value": 2, "op": "SCMP_CMP_EQ"}]), (["socket"], [{"index": 0, "value": 10, "op": "SCMP_CMP_EQ"}])]


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
def test_the_cell_pod_validates_strictly_against_the_pod_schema(tls: bool) -> None:
    import kubernetes_validate

    from cellblock.server.cells import CellSpec

    config = KubernetesExecutorConfig(runtime_class="runsc", cell_tls_secret="cell-tls" if tls else None, owner=Owner("r", "cellblock-cells", "u"))
    pod = pod_manifest(config, CellSpec(**SPEC_ARGS), bridge_address="10.0.0.7:50052", instance_id="i")
    kubernetes_validate.validate(pod, "1.32.0", strict=True)


def test_a_docker_cell_started_for_the_pool_starts_at_a_low_cpu_weight() -> None:
    """A warm cell's start-up yields to the legs' cells (CPU weight, not quota); a leg's own cell keeps the engine's default."""
    from cellblock.server.cells import CellSpec

    ahead = CellSpec(**SPEC_ARGS, ahead=True)
    assert container_options(DockerExecutorConfig(), ahead, "{}")["cpu_shares"] == 2
    assert container_options(DockerExecutorConfig(ahead_cpu_shares=16), ahead, "{}")["cpu_shares"] == 16
    # runsc answers the engine's `update` with HTTP 500: a warm gVisor cell starts at the leg's weight.
    assert "cpu_shares" not in container_options(DockerExecutorConfig(runtime="runsc"), ahead, "{}")
    assert container_options(DockerExecutorConfig(runtime="runc"), ahead, "{}")["cpu_shares"] == 2
    assert "cpu_shares" not in container_options(DockerExecutorConfig(ahead_cpu_shares=0), ahead, "{}")
    leg = container_options(DockerExecutorConfig(), CellSpec(**SPEC_ARGS), "{}")
    assert "cpu_shares" not in leg
    assert container_options(DockerExecutorConfig(), ahead, "{}")["nano_cpus"] == leg["nano_cpus"], "the quota is the same"
