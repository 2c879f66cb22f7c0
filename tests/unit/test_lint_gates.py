"""The repo's own lint gates: the private-module import contract and the module size check."""

from __future__ import annotations

import subprocess
from pathlib import Path

import grimp

from scripts.check_module_size import oversized
from scripts.importlinter_private import PrivateModulesContract


def _graph(*imports: tuple[str, str]) -> grimp.ImportGraph:
    graph = grimp.ImportGraph()
    for importer, imported in imports:
        graph.add_import(importer=importer, imported=imported, line_number=3, line_contents=f"import {imported}")
    return graph


def _contract(**options: object) -> PrivateModulesContract:
    return PrivateModulesContract(name="private", session_options={}, contract_options=dict(options))


def test_a_private_module_imported_from_another_package_breaks_the_contract() -> None:
    graph = _graph(
        ("pkg.api._service", "pkg.catalog._hints"),  # across packages: illegal
        ("pkg.catalog._search", "pkg.catalog._hints"),  # inside the package: fine
        ("pkg.catalog", "pkg.catalog._hints"),  # the package's own __init__: fine
        ("pkg.api._service", "pkg.catalog"),  # the public surface: fine
        ("pkg.app", "pkg.__main__"),  # dunder modules are not private
    )
    check = _contract().check(graph, verbose=False)
    assert not check.kept
    assert [(i["importer"], i["imported"], i["owner"], i["lines"]) for i in check.metadata["illegal"]] == [
        ("pkg.api._service", "pkg.catalog._hints", "pkg.catalog", [3]),
    ]


def test_a_nested_private_package_is_private_to_its_parent() -> None:
    graph = _graph(("pkg.runs.leg", "pkg.cells._docker.options"), ("pkg.cells.pool", "pkg.cells._docker.options"))
    check = _contract().check(graph, verbose=False)
    assert [i["importer"] for i in check.metadata["illegal"]] == ["pkg.runs.leg"]


def test_an_ignored_import_keeps_the_contract() -> None:
    graph = _graph(("pkg.api._service", "pkg.catalog._hints"))
    check = _contract(ignore_imports=["pkg.api._service -> pkg.catalog._hints"]).check(graph, verbose=False)
    assert check.kept and check.ignored_import_count == 1


def test_the_size_check_lists_only_modules_over_the_limit(tmp_path: Path) -> None:
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "server").mkdir()
    (tmp_path / "server" / "short.py").write_text("x = 1\n" * 5)
    (tmp_path / "server" / "long.py").write_text("x = 1\n" * 6)
    (tmp_path / "proto").mkdir()
    (tmp_path / "proto" / "long_pb2.py").write_text("x = 1\n" * 50)  # generated: exempt
    assert oversized(tmp_path, max_lines=5) == [("server/long.py", 6)]
