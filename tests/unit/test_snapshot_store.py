"""The snapshot store interface and its in-memory default; stale cell leftovers."""

from pathlib import Path

from cellblock.server.runs import RunRegistry
from cellblock.server.store import InMemorySnapshotStore


def test_in_memory_store_puts_gets_replaces_and_deletes() -> None:
    store = InMemorySnapshotStore()
    assert store.get("run_a") is None
    store.put("run_a", b"one")
    store.put("run_b", b"three")
    store.put("run_a", b"two!")
    assert store.get("run_a") == b"two!"
    assert store.total_bytes() == 9
    store.delete("run_a")
    store.delete("run_a")
    assert store.get("run_a") is None and store.total_bytes() == 5


def test_registry_uses_the_store_it_is_given() -> None:
    store = InMemorySnapshotStore()
    registry = RunRegistry(store=store)
    assert registry.store is store
    assert RunRegistry().store is not store


def test_an_instance_keeps_its_id_and_its_directories_to_itself(tmp_path: Path) -> None:
    import os

    import pytest

    from cellblock.server.app import _remove_socket_dirs, instance_id, lock_directories

    first = instance_id(str(tmp_path / "state"))
    assert instance_id(str(tmp_path / "state")) == first and len(first) == 16
    assert instance_id(str(tmp_path / "other")) != first
    fds = lock_directories(str(tmp_path / "state"))
    with pytest.raises(RuntimeError, match="another cellblock instance is using"):
        lock_directories(str(tmp_path / "state"))
    for fd in fds:
        os.close(fd)
    os.close(lock_directories(str(tmp_path / "state"))[0])
    cell, other = tmp_path / "cell-old", tmp_path / "keep-me"
    cell.mkdir()
    other.mkdir()
    assert _remove_socket_dirs(str(tmp_path)) == 1
    assert not cell.exists() and other.exists()
