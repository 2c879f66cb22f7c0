"""The snapshot store interface and its in-memory default."""

from cellblock.server.runs import RunRegistry
from cellblock.server.snapshots import InMemorySnapshotStore


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
