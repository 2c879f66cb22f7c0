"""Test helpers about cell containers."""

from __future__ import annotations

from cellblock.server.app import Service
from cellblock.server.cells import DockerExecutor


def leg_cells(service: Service) -> list[str]:
    """Cell containers of the service that serve a leg (the warm pool's idle cells excluded)."""
    executor = service.executor
    assert isinstance(executor, DockerExecutor)
    idle = service.pool.idle_container_names() if service.pool is not None else set()
    return [name for name in executor.list_cell_containers() if name not in idle]
