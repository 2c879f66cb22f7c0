"""Shared test configuration and the test tiers.

Tiers (markers registered in ``pyproject.toml``):

* ``docker``: needs a Docker engine and the real cell image (built by `make image`,
  which `make test` runs first); never falls back to the process executor. Every test
  under ``tests/integration`` is marked here, unless its module marks itself ``process``.
* ``process``: real cells as local guest-agent subprocesses (the ``process`` executor,
  real QuickJS), no Docker: everything under ``tests/process`` (marked here), and
  integration modules that mark themselves (``test_watchdogs``: substitute guests).
* ``k8s``: needs a Kubernetes cluster (KUBECONFIG).

`make test-fast` runs everything not marked ``docker`` or ``k8s``.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.postgres import Cluster, throwaway_cluster

os.environ.setdefault("TESTCONTAINERS_RYUK_DISABLED", "true")

_TESTS = Path(__file__).resolve().parent

# Services started by tests keep their run store (the default SQLite file under
# CELLBLOCK_STATE_DIR's default, $XDG_STATE_HOME/cellblock) in this session's own
# directory, never in the user's state directory.
_STATE_HOME = tempfile.mkdtemp(prefix="cellblock-test-xdg-state-")
os.environ["XDG_STATE_HOME"] = _STATE_HOME
atexit.register(shutil.rmtree, _STATE_HOME, True)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Marks each test with its tier from where it lives and which fixtures it uses."""
    for item in items:
        path = Path(str(item.fspath)).resolve()
        if path.is_relative_to(_TESTS / "process"):
            item.add_marker(pytest.mark.process)
        elif path.is_relative_to(_TESTS / "integration") and item.get_closest_marker("process") is None:
            item.add_marker(pytest.mark.docker)


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[Cluster]:
    """A real, throwaway PostgreSQL cluster for the session (unix socket; removed at the end)."""
    with throwaway_cluster() as cluster:
        yield cluster
