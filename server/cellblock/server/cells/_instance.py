"""What keeps a service instance to its own cells across restarts (SPEC §16.2 item 5).

An instance has a stable id in its state directory (:func:`instance_id`); its cells carry
it as a label. Each directory an instance uses is locked while it lives
(:func:`lock_directories`), so at start it may remove every cell and bridge directory with
its id, what an earlier incarnation killed by SIGKILL left (:func:`recover_orphans`).
"""

from __future__ import annotations

import fcntl
import os
import secrets
import shutil
from pathlib import Path

import structlog

from cellblock.server.cells._base import Executor

log = structlog.get_logger("cellblock.server")


#: File in the state directory that keeps the instance id across restarts.
INSTANCE_ID_FILE = "instance-id"


def instance_id(state_dir: str) -> str:
    """The instance's stable id, read from ``<state_dir>/instance-id`` or created there.

    Cells carry it as a label, so that after a crash the next start of the same
    instance recognises its own orphans and never touches another instance's cells.

    Raises:
        OSError: The state directory cannot be created or written (a start-up error).
    """
    path = Path(state_dir) / INSTANCE_ID_FILE
    try:
        text = path.read_text("ascii").strip()
        if len(text) == 16 and all(c in "0123456789abcdef" for c in text):
            return text
    except (OSError, UnicodeDecodeError):
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    value = secrets.token_hex(8)
    temporary = path.with_name(f".{INSTANCE_ID_FILE}.{os.getpid()}")
    temporary.write_text(value + "\n", "ascii")
    os.replace(temporary, path)
    return value


class InstanceLockedError(RuntimeError):
    """Another live instance holds the lock of a state or socket directory (a start-up error, SPEC §16.1 item 1)."""


#: Lock file that keeps two live instances out of one state or socket directory.
LOCK_FILE = ".cellblock.lock"


def lock_directories(*directories: str) -> list[int]:
    """Takes an exclusive lock on each directory (``flock`` on ``<dir>/.cellblock.lock``).

    An instance removes every ``cell-*`` socket directory and every cell with its
    instance id at start; the lock makes sure no other live instance shares them.

    Returns:
        The open lock file descriptors (held until the process exits or they are closed).

    Raises:
        InstanceLockedError: Another live instance holds a lock (a start-up error).
    """
    fds: list[int] = []
    for directory in dict.fromkeys(directories):
        Path(directory).mkdir(parents=True, exist_ok=True)
        fd = os.open(os.path.join(directory, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            for held in fds:
                os.close(held)
            raise InstanceLockedError(f"another cellblock instance is using {directory}; give each instance its own CELLBLOCK_SOCKET_DIR and CELLBLOCK_STATE_DIR") from None
        fds.append(fd)
    return fds


async def recover_orphans(socket_dir: str, executor: Executor) -> None:
    """Removes what an earlier incarnation of this instance left: its cells and socket directories.

    Runs before the server accepts RPCs, so nothing found belongs to a live leg.
    """
    removed_dirs = remove_socket_dirs(socket_dir)
    try:
        removed = await executor.remove_orphans()
    except Exception as exc:  # noqa: BLE001 - an unreachable engine fails legs later, closed
        log.error("server.orphans_unchecked", reason=exc.__class__.__name__)
        removed = 0
    if removed or removed_dirs:
        log.info("server.orphans_removed", cells=removed, socket_dirs=removed_dirs)


def remove_socket_dirs(base: str) -> int:
    """Removes every ``cell-*`` socket directory under this instance's ``base``; returns how many."""
    try:
        names = os.listdir(base)
    except OSError:
        return 0
    removed = 0
    for name in names:
        if name.startswith("cell-"):
            shutil.rmtree(os.path.join(base, name), ignore_errors=True)
            removed += 1
    return removed
