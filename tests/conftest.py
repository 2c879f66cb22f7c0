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

import os
from pathlib import Path

import pytest

os.environ.setdefault("TESTCONTAINERS_RYUK_DISABLED", "true")

_TESTS = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Marks each test with its tier from where it lives and which fixtures it uses."""
    for item in items:
        path = Path(str(item.fspath)).resolve()
        if path.is_relative_to(_TESTS / "process"):
            item.add_marker(pytest.mark.process)
        elif path.is_relative_to(_TESTS / "integration") and item.get_closest_marker("process") is None:
            item.add_marker(pytest.mark.docker)
