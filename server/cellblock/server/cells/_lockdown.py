"""The cell lockdown: one description, from which every executor's cell options derive.

SPEC §15 item 1 and DESIGN.md §3 list what a cell must be: no network beyond its
bridge, the project's seccomp allow-list, a read-only root, a non-root user, no
capabilities, no privilege gain, no host environment, no devices, no host
namespaces, CPU, memory and process limits. :class:`Lockdown` states each point
once. ``_docker.container_options`` and ``_kubernetes.pod_manifest`` translate it
into Docker create options and a pod spec; ``tests/unit/cells/test_lockdown.py``
compares both translations with it point by point, so neither can drift.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_REPO_ROOT = Path(__file__).resolve().parents[4]
DEFAULT_SECCOMP_PROFILE = _REPO_ROOT / "sandbox-image" / "seccomp.json"
#: uid:gid of the cell user baked into the image (sandbox-image/Dockerfile).
CELL_UID = 65532
#: Environment variables a cell receives (nothing of the host's own environment).
BRIDGE_SOCKET_ENV = "CELLBLOCK_BRIDGE_SOCKET"
BRIDGE_ADDRESS_ENV = "CELLBLOCK_BRIDGE_ADDRESS"
CELL_TOKEN_ENV = "CELLBLOCK_CELL_TOKEN"
#: The engine heap limit the cell is sized for (not a secret): the agent prepares its VM before the leg.
MEMORY_LIMIT_ENV = "CELLBLOCK_MEMORY_LIMIT_BYTES"
#: Address families a TCP-bridge cell may open sockets in (pod IPs are IPv4 or IPv6).
_TCP_FAMILIES = ((2, "AF_INET"), (10, "AF_INET6"))
#: TLS material for a TCP bridge with mutual authentication (paths inside the cell).
BRIDGE_TLS_ENV = ("CELLBLOCK_BRIDGE_TLS_CA", "CELLBLOCK_BRIDGE_TLS_CERT", "CELLBLOCK_BRIDGE_TLS_KEY")


@dataclass(frozen=True)
class Lockdown:
    """Every isolation point of a cell (SPEC §15 item 1), stated once.

    Attributes:
        uid: The cell's uid and gid (non-root; the image's ``cell`` user).
        read_only_root: The root file system is mounted read-only.
        drop_capabilities: Capabilities removed (all of them); none are added.
        no_new_privileges: setuid binaries and file capabilities gain nothing.
        seccomp_profile: Path of the seccomp allow-list (JSON) on the host that
            starts the cell; on Kubernetes the same file under the kubelet's
            seccomp directory (:attr:`seccomp_localhost_name`).
        network: ``none`` (Docker: no network namespace interfaces) or
            ``bridge-only`` (Kubernetes: the pod network, with a NetworkPolicy
            that allows only the replica's bridge port).
        pids_limit: Most processes and threads in the cell.
        cpu_millis: CPU quota in thousandths of a core.
        overhead_memory_bytes: Memory above the leg's engine heap limit for the
            guest agent (Python, wasmtime, grpcio), in bytes.
        ephemeral_storage_bytes: Writable scratch the runtime may account to the
            cell (logs); the root is read-only, so nothing else is writable.
        host_environment: Whether any of the host's environment reaches the
            cell (never: only the bridge variables are passed).
        host_namespaces: Whether the cell shares a host namespace (network,
            PID, IPC) (never; IPC is private).
        devices: Devices passed into the cell (none).
        privileged: Privileged mode (never).
        read_only_tmp: ``/tmp`` is an empty read-only mount. gVisor mounts a
            writable tmpfs at ``/tmp`` of its own unless the spec mounts one,
            so the read-only root alone does not cover it.
        ipc: ``none``: a private IPC namespace without ``/dev/shm`` (a
            writable tmpfs otherwise).
    """

    uid: int = CELL_UID
    read_only_root: bool = True
    drop_capabilities: tuple[str, ...] = ("ALL",)
    no_new_privileges: bool = True
    seccomp_profile: Path = DEFAULT_SECCOMP_PROFILE
    network: str = "none"
    pids_limit: int = 64
    cpu_millis: int = 1000
    overhead_memory_bytes: int = 192 * 1024 * 1024
    ephemeral_storage_bytes: int = 16 * 1024 * 1024
    host_environment: bool = False
    host_namespaces: bool = False
    devices: tuple[str, ...] = ()
    privileged: bool = False
    read_only_tmp: bool = True
    ipc: str = "none"

    def memory_bytes(self, heap_limit_bytes: int) -> int:
        """The cell's memory limit (swap included): the leg's heap limit plus the agent's overhead, in bytes."""
        return heap_limit_bytes + self.overhead_memory_bytes

    @property
    def seccomp_localhost_name(self) -> str:
        """The profile's name under the kubelet's seccomp root (``/var/lib/kubelet/seccomp``).

        ``k8s/base/seccomp/cellblock-cell.json`` (:meth:`seccomp_text` with the TCP
        bridge) is installed there by ``cellblock-seccomp-installer``.
        """
        return "profiles/cellblock-cell.json"

    def seccomp_profile_for(self, *, tcp_bridge: bool) -> dict[str, Any]:
        """The cell's seccomp profile (the file at :attr:`seccomp_profile`).

        With ``tcp_bridge`` (Kubernetes cells dial their replica's bridge port)
        the file's rules plus one: ``socket(2)`` in AF_INET and AF_INET6 as well
        as AF_UNIX. Nothing else changes: still no bind/listen/accept, no fork.

        Raises:
            OSError, ValueError: The file cannot be read or is not JSON.
        """
        profile: dict[str, Any] = json.loads(Path(self.seccomp_profile).read_text("utf-8"))
        if tcp_bridge:
            for value, name in _TCP_FAMILIES:
                profile["syscalls"].append({"comment": f"TCP bridge (Kubernetes cells, SPEC §16.3 item 2): socket(2) in {name}", "names": ["socket"], "action": "SCMP_ACT_ALLOW", "args": [{"index": 0, "value": value, "op": "SCMP_CMP_EQ"}]})
        return profile

    def seccomp_text(self, *, tcp_bridge: bool) -> str:
        """:meth:`seccomp_profile_for` as the exact text installed on nodes (2-space JSON, final newline)."""
        return json.dumps(self.seccomp_profile_for(tcp_bridge=tcp_bridge), indent=2, ensure_ascii=False) + "\n"

    def seccomp_sha256(self) -> str:
        """SHA-256 (hex) of the Kubernetes profile text; each cell pod carries it as an annotation."""
        return hashlib.sha256(self.seccomp_text(tcp_bridge=True).encode("utf-8")).hexdigest()


#: The lockdown every cell gets; executors take limits from it and never turn a point off.
DEFAULT_LOCKDOWN = Lockdown()
