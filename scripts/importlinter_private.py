"""An import-linter contract type: private modules stay inside their package.

A module whose last name part starts with ``_`` (``cellblock.server.catalog._hints``) is private to
its parent package (``cellblock.server.catalog``): only modules inside that package may import it.
Everyone else goes through the package's ``__init__``. Dunder modules (``__init__``, ``__main__``)
are not private. The built-in ``protected`` type would need one contract per package and would
silently miss a new package; this type covers every package under the root packages.

Configured in pyproject.toml::

    [tool.importlinter]
    contract_types = ["private_modules: importlinter_private.PrivateModulesContract"]

    [[tool.importlinter.contracts]]
    name = "..."
    type = "private_modules"
    ignore_imports = ["a.b -> c._d"]   # optional, each with a reason in a comment
"""

from __future__ import annotations

from typing import Any

from grimp import ImportGraph
from importlinter import Contract, ContractCheck, fields, output
from importlinter.application import contract_utils


def _private_owner(module: str) -> str | None:
    """The package a private module belongs to, or ``None`` when ``module`` is not private."""
    parts = module.split(".")
    for index, part in enumerate(parts):
        if part.startswith("_") and not (part.startswith("__") and part.endswith("__")):
            return ".".join(parts[:index])
    return None


def _inside(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


class PrivateModulesContract(Contract):
    """No module imports a private (``_x``) module of a package it is not inside.

    Configuration options:
        - ignore_imports: Import expressions (``importer -> imported``) to leave out. (Optional.)
        - unmatched_ignore_imports_alerting: ``none``, ``warn`` or ``error`` (default) when an
          ignored import is not in the graph.
    """

    type_name = "private_modules"

    ignore_imports = fields.SetField(subfield=fields.ImportExpressionField(), required=False)
    unmatched_ignore_imports_alerting = fields.EnumField(contract_utils.AlertLevel, default=contract_utils.AlertLevel.ERROR)

    def check(self, graph: ImportGraph, verbose: bool) -> ContractCheck:
        """Lists every direct import of a private module from outside its package."""
        removal = contract_utils.remove_ignored_imports_and_report(
            graph=graph,
            ignore_imports=self.ignore_imports,  # type: ignore[arg-type]
            unmatched_alerting=self.unmatched_ignore_imports_alerting,  # type: ignore[arg-type]
        )
        illegal: list[dict[str, Any]] = []
        for imported in sorted(graph.modules):
            owner = _private_owner(imported)
            if owner is None:
                continue
            for importer in sorted(graph.find_modules_that_directly_import(imported)):
                if _inside(importer, owner):
                    continue
                details = graph.get_import_details(importer=importer, imported=imported)
                lines = sorted({d["line_number"] for d in details})
                illegal.append({"importer": importer, "imported": imported, "owner": owner, "lines": lines})
        return ContractCheck(kept=not illegal, metadata={"illegal": illegal}, warnings=list(removal.warnings), ignored_import_count=removal.ignored_import_count)

    def render_broken_contract(self, check: ContractCheck) -> None:
        """Prints one line per illegal import, with its line numbers."""
        for item in check.metadata["illegal"]:
            lines = ", ".join(str(n) for n in item["lines"])
            output.print_error(f"{item['importer']} -> {item['imported']} (l. {lines}): private to {item['owner']}; import it from {item['owner']}", bold=False)
            output.new_line()
