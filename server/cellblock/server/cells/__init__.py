"""Cells: the host side of the trust boundary.

Everything that stands between the service and untrusted code lives here: the executors
that start locked-down cells (``_docker``, and the explicit-only ``_process``), the warm
pool (``_pool``), and the bridge server each cell attaches to over its own socket with its
one-time token (``_bridge``).
"""

from cellblock.server.cells._base import Cell, CellSpec, CellStartError, Executor
from cellblock.server.cells._bridge import CellBridge
from cellblock.server.cells._docker import DockerExecutor, DockerExecutorConfig, container_options
from cellblock.server.cells._pool import WarmPool
from cellblock.server.cells._process import ProcessExecutor

__all__ = [
    "Cell",
    "CellBridge",
    "CellSpec",
    "CellStartError",
    "DockerExecutor",
    "DockerExecutorConfig",
    "Executor",
    "ProcessExecutor",
    "WarmPool",
    "container_options",
]
