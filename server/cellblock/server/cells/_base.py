"""The executor seam: how the host starts, watches and destroys cells.

An executor turns a :class:`CellSpec` into a running cell whose guest agent
attaches to the given bridge socket. Executors never fall back to one another:
if the configured one cannot start a cell, the leg fails with
``runtime_unavailable`` (SPEC §15 item 5).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass

from cellblock.server.cells._bridge import DEFAULT_MAX_MESSAGE_BYTES, CellBridge
from cellblock.server.cells._reaper import CellReaper


class CellStartError(Exception):
    """A cell could not be started; the message is the reason for [R11]."""


@dataclass(frozen=True)
class CellSpec:
    """What one cell needs.

    Attributes:
        cell_id: Unique id of the cell (``cell_`` plus 16 hex digits).
        bridge_dir: Host path of the cell's private socket directory; the
            cell's only mount (``""`` for TCP bridges, whose address the
            executor knows).
        cell_token: The one-time bridge token.
        memory_limit_bytes: The run's engine heap limit in bytes; the
            container's own memory limit is derived from it.
        ahead: Started ahead of any leg (the warm pool): executors that can
            start it at a low CPU weight, so that its start-up yields the CPU to
            the cells serving legs, until :meth:`Cell.serve_ready` (DESIGN.md §2).
    """

    cell_id: str
    bridge_dir: str
    cell_token: str
    memory_limit_bytes: int
    ahead: bool = False


class Cell(abc.ABC):
    """A started cell."""

    cell_id: str
    #: Human-readable identity of what runs the cell (container id, pid).
    runtime_id: str

    @abc.abstractmethod
    async def wait(self) -> int:
        """Waits until the cell exits and returns its exit code."""

    @abc.abstractmethod
    async def kill(self) -> None:
        """Stops the cell at once. Idempotent."""

    async def out_of_memory(self) -> bool:
        """Whether the cell, which exited with 137 (SIGKILL), was killed for its memory limit.

        Executors that cannot tell (processes) answer ``True``: their only SIGKILL is the limit.
        """
        return True

    async def alive(self) -> bool:
        """Whether the cell still runs and is not paused (checked before a pooled cell is used)."""
        return True

    async def serve_ready(self) -> None:
        """Gives a cell started ahead of its leg (:attr:`CellSpec.ahead`) the CPU weight of a leg's cell.

        Called by the warm pool once the cell attached, before any leg can take it.
        Executors that start every cell at the same weight do nothing.

        Raises:
            CellStartError: The weight could not be changed (the pool then drops the cell).
        """
        return None

    @abc.abstractmethod
    async def remove(self) -> None:
        """Kills the cell if needed and removes every trace of it. Idempotent."""


class Executor(abc.ABC):
    """Starts cells.

    Attributes:
        name: Configuration name of the executor (``docker``, ``process``).
        cells_started: Cells started since the executor was created; tests use
            it to assert that a rejection started no cell.
    """

    name: str = ""
    #: The cell image, for executors that run one (``container.image.name`` on cell spans).
    image: str = ""

    def __init__(self) -> None:
        self.cells_started = 0
        #: Removes ended cells off the legs' reply path (awaited at close).
        self.reaper = CellReaper()

    @property
    @abc.abstractmethod
    def cell_uid(self) -> int:
        """The uid the cell's agent runs as (owner of the bridge socket)."""

    @abc.abstractmethod
    async def check(self) -> None:
        """Verifies that cells can start (engine reachable, image present).

        Raises:
            CellStartError: With the reason they cannot.
        """

    async def open_bridge(self, base_dir: str, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES, *, ping: bool = False) -> CellBridge:
        """Opens the bridge endpoint for one new cell (before :meth:`start`).

        The default is the unix transport: a private socket directory under
        ``base_dir`` that the cell's uid alone may use, whose server reads no
        message over ``max_message_bytes``. Executors whose cells reach the host
        over the network (Kubernetes) override it (their shared listener keeps
        the default bound; the leg checks each run's own). ``ping`` makes the host
        ping the cell's connection and end its stream when a ping goes unanswered
        (warm cells, which wait unused).

        Raises:
            OSError: The endpoint could not be created.
        """
        return await CellBridge.open(base_dir, socket_uid=self.cell_uid, max_message_bytes=max_message_bytes, ping=ping)

    @abc.abstractmethod
    async def start(self, spec: CellSpec) -> Cell:
        """Starts one cell.

        Raises:
            CellStartError: The cell could not be started.
        """

    async def remove_orphans(self) -> int:
        """Removes cells an earlier incarnation of this instance left behind; returns how many.

        Executors whose cells cannot outlive the service (processes) have none.
        """
        return 0

    async def close(self) -> None:
        """Releases executor resources; waits for every retired cell's removal first."""
        await self.reaper.drain()
