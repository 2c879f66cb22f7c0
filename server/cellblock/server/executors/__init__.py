"""Executors start cells: Docker (default) and an explicit-only process one."""

from cellblock.server.executors._base import Cell, CellSpec, CellStartError, Executor
from cellblock.server.executors._docker import DockerExecutor, DockerExecutorConfig, container_options
from cellblock.server.executors._pool import WarmCell, WarmPool
from cellblock.server.executors._process import ProcessExecutor

__all__ = [
    "Cell",
    "CellSpec",
    "CellStartError",
    "DockerExecutor",
    "DockerExecutorConfig",
    "Executor",
    "ProcessExecutor",
    "WarmCell",
    "WarmPool",
    "container_options",
]
