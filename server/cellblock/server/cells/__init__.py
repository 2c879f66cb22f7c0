"""Cells: the host side of the trust boundary.

Everything that stands between the service and untrusted code lives here: the executors
that start locked-down cells (``_docker``, ``_kubernetes``, and the explicit-only
``_process``) from one lockdown description (``_lockdown``), the warm pool (``_pool``), the cells
kept for their scope's next leg (``_reuse``, SPEC §16.2), and
the bridge each cell attaches to with its one-time token (``_bridge``: a unix socket per
cell, or the replica's TCP bridge port), and the instance's hold on its own cells
(``_instance``: its stable id, directory locks, orphan removal at start).
"""

from cellblock.server.cells._base import Cell, CellSpec, CellStartError, Executor
from cellblock.server.cells._bridge import BridgeListener, BridgeTls, CellBridge
from cellblock.server.cells._docker import DockerExecutor, DockerExecutorConfig, container_options
from cellblock.server.cells._instance import (
    INSTANCE_ID_FILE,
    LOCK_FILE,
    InstanceLockedError,
    instance_id,
    lock_directories,
    recover_orphans,
    remove_socket_dirs,
)
from cellblock.server.cells._kubernetes import KubernetesExecutor
from cellblock.server.cells._kubernetes_pod import KubernetesExecutorConfig, Owner, pod_manifest
from cellblock.server.cells._lockdown import DEFAULT_LOCKDOWN, Lockdown
from cellblock.server.cells._pool import WarmPool
from cellblock.server.cells._process import ProcessExecutor
from cellblock.server.cells._reaper import CellReaper
from cellblock.server.cells._reuse import MAX_IDLE_LIMIT_S, REUSE_MODES, ScopeCell, ScopeCells

__all__ = [
    "DEFAULT_LOCKDOWN",
    "INSTANCE_ID_FILE",
    "InstanceLockedError",
    "LOCK_FILE",
    "MAX_IDLE_LIMIT_S",
    "REUSE_MODES",
    "BridgeListener",
    "BridgeTls",
    "Cell",
    "CellBridge",
    "CellReaper",
    "CellSpec",
    "CellStartError",
    "DockerExecutor",
    "DockerExecutorConfig",
    "Executor",
    "KubernetesExecutor",
    "KubernetesExecutorConfig",
    "Lockdown",
    "Owner",
    "ProcessExecutor",
    "ScopeCell",
    "ScopeCells",
    "WarmPool",
    "container_options",
    "instance_id",
    "lock_directories",
    "pod_manifest",
    "recover_orphans",
    "remove_socket_dirs",
]
