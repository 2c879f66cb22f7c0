"""A service instance's stable id and the locks that keep its directories to itself (issue 11)."""

import os
from pathlib import Path

import pytest

from cellblock.server.cells import InstanceLockedError, instance_id, lock_directories, remove_socket_dirs


def test_an_instance_keeps_its_id_and_its_directories_to_itself(tmp_path: Path) -> None:
    first = instance_id(str(tmp_path / "state"))
    assert instance_id(str(tmp_path / "state")) == first and len(first) == 16
    assert instance_id(str(tmp_path / "other")) != first
    fds = lock_directories(str(tmp_path / "state"))
    with pytest.raises(InstanceLockedError, match="another cellblock instance is using"):
        lock_directories(str(tmp_path / "state"))
    for fd in fds:
        os.close(fd)
    os.close(lock_directories(str(tmp_path / "state"))[0])
    cell, other = tmp_path / "cell-old", tmp_path / "keep-me"
    cell.mkdir()
    other.mkdir()
    assert remove_socket_dirs(str(tmp_path)) == 1
    assert not cell.exists() and other.exists()
