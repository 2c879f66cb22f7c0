"""Run-store fixtures: every contract test runs on memory:, SQLite (a temp file) and a real PostgreSQL."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Callable

import pytest
import pytest_asyncio

from cellblock.server.store import RunStore, make_run_store
from tests.support.postgres import Cluster

_names = itertools.count(1)


@pytest.fixture(params=["memory", "sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    if request.param == "memory":
        return "memory:"
    if request.param == "sqlite":
        return "sqlite:///" + str(tmp_path_factory.mktemp("store") / "runs.sqlite3").lstrip("/")
    cluster: Cluster = request.getfixturevalue("pg_cluster")
    return cluster.database(f"unit_{next(_names)}")


@pytest.fixture
def open_store(store_url: str) -> Callable[..., RunStore]:
    """Builds (not opens) a store on the test's URL; call again for a second handle on the same data."""

    def make(cap: int = 8) -> RunStore:
        return make_run_store(store_url, cap)

    return make


@pytest_asyncio.fixture
async def store(open_store: Callable[..., RunStore]) -> AsyncIterator[RunStore]:
    s = open_store(cap=8)
    await s.open()
    yield s
    assert await s.check_integrity() == []
    await s.close()
