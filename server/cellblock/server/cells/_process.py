"""The ``process`` executor: the guest agent as a local subprocess.

For development and tests only. It provides none of the container layers
(no seccomp, no read-only root, the host's network namespace), so it exists
only when named explicitly in the configuration; nothing ever falls back to it.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from cellblock.server.cells._base import Cell, CellSpec, CellStartError, Executor

_REPO_ROOT = Path(__file__).resolve().parents[4]


class ProcessCell(Cell):
    """A guest agent subprocess."""

    def __init__(self, proc: asyncio.subprocess.Process, cell_id: str) -> None:
        self._proc = proc
        self.cell_id = cell_id
        self.runtime_id = f"pid-{proc.pid}"

    async def wait(self) -> int:
        return await self._proc.wait()

    async def kill(self) -> None:
        if self._proc.returncode is None:
            try:
                self._proc.kill()
            except ProcessLookupError:
                pass

    async def remove(self) -> None:
        await self.kill()
        await self._proc.wait()


class ProcessExecutor(Executor):
    """Runs each cell's guest agent as a subprocess of the service."""

    name = "process"

    def __init__(self, *, module: str = "cellblock.guest", extra_path: tuple[str, ...] = ()) -> None:
        """Creates the executor.

        Args:
            module: The agent module run with ``python -m`` (tests substitute
                misbehaving agents to prove the host's own defences).
            extra_path: Directories added to the agent's ``PYTHONPATH``.
        """
        super().__init__()
        self._module = module
        self._extra_path = extra_path

    @property
    def cell_uid(self) -> int:
        return os.getuid()

    async def check(self) -> None:
        return None

    async def start(self, spec: CellSpec) -> Cell:
        self.cells_started += 1
        path = os.pathsep.join([*(str(_REPO_ROOT / p) for p in ("sandbox-image/guest", "proto")), *self._extra_path])
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "PYTHONPATH": path,
            "CELLBLOCK_BRIDGE_SOCKET": os.path.join(spec.bridge_dir, "bridge.sock"),
            "CELLBLOCK_CELL_TOKEN": spec.cell_token,
            "CELLBLOCK_MEMORY_LIMIT_BYTES": str(spec.memory_limit_bytes),
        }
        try:
            proc = await asyncio.create_subprocess_exec(sys.executable, "-m", self._module, env=env)
        except OSError as exc:
            raise CellStartError(f"the guest agent could not be started ({exc.__class__.__name__})") from None
        return ProcessCell(proc, spec.cell_id)
