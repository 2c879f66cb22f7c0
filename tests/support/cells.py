"""Test helpers about cell containers."""

from __future__ import annotations

import asyncio
import os

from cellblock.client import CellblockClient, Scope
from cellblock.server.app import Service
from cellblock.server.cells import DockerExecutor

#: The cell image of the integration tests.
IMAGE = os.environ.get("CELLBLOCK_IMAGE", "cellblock-cell:dev")
#: OCI runtime of every cell in the session (``runsc`` for gVisor: ``make test-runsc``).
OCI_RUNTIME = os.environ.get("CELLBLOCK_OCI_RUNTIME") or None
#: Factor on the hostile tests' leg budgets and their hang bounds: gVisor's ptrace platform makes
#: every cell start and syscall slower, so ``make test-runsc`` sets 2 (the program's limits and
#: the bounds scale together; what must end still has to end).
TIME_SCALE = float(os.environ.get("CELLBLOCK_TEST_TIME_SCALE", "1"))


def leg_cells(service: Service) -> list[str]:
    """Cell containers of the service that serve a leg.

    Excluded: the warm pool's idle cells, and retired cells, whose leg ended and
    whose bridge stream is already closed, while the reaper removes them.
    """
    executor = service.executor
    assert isinstance(executor, DockerExecutor)
    idle = service.pool.idle_container_names() if service.pool is not None else set()
    idle |= {f"cellblock-{cell_id}" for cell_id in executor.reaper.retiring}
    return [name for name in executor.list_cell_containers() if name not in idle]


def cells_asked_for(service: Service) -> int:
    """How many times a leg of the service asked for a cell (a pool hit, or a fresh start).

    Not ``executor.cells_started``: the warm pool sizes itself and refills in the background,
    so a cell may start while a test's request is refused at input, with no leg behind it.
    """
    if service.pool is not None:
        return service.pool.hits + service.pool.misses
    return int(service.executor.cells_started)


def cell_dirs(socket_dir: str) -> list[str]:
    """The per-cell bridge directories (``cell-*``) under a socket directory.

    The directory also holds the instance's lock file (and, with :func:`state_dir_in`, its
    state directory), which stay.
    """
    return sorted(name for name in os.listdir(socket_dir) if name.startswith("cell-"))


def state_dir_in(socket_dir: str) -> str:
    """A test service's own state directory (``CELLBLOCK_STATE_DIR``), inside its socket directory.

    Each live instance locks its state directory (SPEC §16.2 item 5), so services a test starts
    beside the session's own each need one; inside the socket directory it goes away with it.
    """
    return os.path.join(socket_dir, "state")


async def ended_without_a_run(service: Service, client: CellblockClient, scope: Scope) -> None:
    """Within 5 s, ``scope`` has no run (none parked, none running) and the service holds no leg slot."""
    for _ in range(50):
        runs = (await client.list_runs(scope)).runs
        if not runs and service.state.admission.running == 0:
            break
        await asyncio.sleep(0.1)
    assert runs == [], runs
    assert service.state.admission.running == 0
