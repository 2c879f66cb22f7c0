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


def test_stale_cell_socket_directories_are_removed_and_fresh_ones_kept(tmp_path: Path) -> None:
    import os
    import time

    from cellblock.server.app import STALE_SOCKET_DIR_S, _remove_stale_socket_dirs

    stale, fresh, other = tmp_path / "cell-old", tmp_path / "cell-new", tmp_path / "keep-me"
    for d in (stale, fresh, other):
        d.mkdir()
    old = time.time() - STALE_SOCKET_DIR_S - 5
    os.utime(stale, (old, old))
    os.utime(other, (old, old))
    _remove_stale_socket_dirs(str(tmp_path))
    assert not stale.exists() and fresh.exists() and other.exists()
