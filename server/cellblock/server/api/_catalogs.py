"""Scope catalogs as the services and legs use them.

Wraps :class:`cellblock.server.catalog.Catalog` (registration, counters,
views) with what a leg needs from its frozen view: the guest's catalog data,
search/describe/lookup answers and the input/output contracts.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

from cellblock.server.catalog import (
    Catalog,
    CatalogEntry,
    CatalogView,
    McpNamespace,
    build_namespace,
    check_input_contract,
    check_output_contract,
    tool_surface,
)
from cellblock.server.config import CodeModeConfig
from cellblock.server.runs import make_telemetry


class RunCatalog:
    """The catalog view one run keeps for all of its legs (SPEC §3.2 item 6)."""

    def __init__(self, view: CatalogView, config: CodeModeConfig) -> None:
        self._view = view
        self._config = config

    @cached_property
    def namespace(self) -> McpNamespace:
        """The run's ``MCP`` namespace and namespace map (SPEC §8.5), computed once per run."""
        return build_namespace(self._view.entries)

    def guest_catalog(self) -> dict[str, Any]:
        """The data the cell installs: ``allTools``, ``convenience``, ``mcp`` (``None`` without
        ``mcp`` entries) and ``apiFiles`` (SPEC §8.1, §8.5, §8.6). Computed once per run; treat
        it as read-only."""
        return self._guest_catalog

    @cached_property
    def _guest_catalog(self) -> dict[str, Any]:
        ns = self.namespace
        return {"allTools": self._view.all_tools(), "convenience": self._view.convenience_names(), "mcp": ns.guest_data(), "apiFiles": ns.api_files()}

    def namespace_entry(self, root: Any, path: Any) -> CatalogEntry | None:
        """The entry a ``namespace`` request targets, or ``None`` when ``[root, path]`` is not in
        the run's namespace map (SPEC §8.5 item 7)."""
        if root != "MCP" or not isinstance(path, str):
            return None
        entry_id = self.namespace.paths.get(path)
        return None if entry_id is None else self._view.get(entry_id)

    def search(self, query: Any, options: Any) -> list[dict[str, Any]]:
        """``tools.search`` (SPEC §7.5). Raises BridgeReplyError."""
        return self._view.search(query, options, config=self._config)

    def describe(self, text: Any) -> dict[str, Any]:
        """``tools.describe`` (SPEC §8.3 item 2). Raises BridgeReplyError."""
        return self._view.describe(text)

    def resolve(self, text: Any, helper: Any) -> CatalogEntry:
        """Resolves a call's id text (SPEC §7.6). Raises BridgeReplyError."""
        return self._view.resolve(text, helper)

    def check_input(self, entry: CatalogEntry, arguments: Any) -> None:
        """Input contract (SPEC §8.4 item 1). Raises BridgeReplyError."""
        check_input_contract(entry, arguments)

    def check_output(self, entry: CatalogEntry, result: Any) -> None:
        """Output contract (SPEC §8.4 item 2). Raises BridgeReplyError."""
        check_output_contract(entry, result)

    def count_call(self) -> None:
        """Counts one nested call request in the view's catalog session."""
        self._view.counters.count_call()

    @staticmethod
    def is_replay_safe_call(entry: CatalogEntry, text: Any) -> bool:
        """SPEC §10.8 item 1: exact host id, replaySafe and not sideEffecting."""
        return entry.source == "host" and text == entry.id and entry.replay_safe and not entry.side_effecting


class ScopeCatalog:
    """One scope's catalog session."""

    def __init__(self, config: CodeModeConfig) -> None:
        self.catalog = Catalog()
        self._config = config

    def view(self) -> RunCatalog:
        """A frozen view for a new run."""
        return RunCatalog(self.catalog.view, self._config)

    def telemetry(self) -> dict[str, Any]:
        """The result telemetry of SPEC §12 item 1 (key order of §10.5)."""
        view = self.catalog.view
        snap = self.catalog.counters.snapshot()
        return make_telemetry(
            catalog_size=view.size,
            sources=view.sources,
            search_count=snap.search_count,
            describe_count=snap.describe_count,
            call_count=snap.call_count,
            counter_scope=snap.counter_scope,
        )

    def tool_surface(self, config: CodeModeConfig, model_id: str | None) -> tuple[bool, list[dict[str, Any]]]:
        """The model-visible tools (SPEC §3.3)."""
        return tool_surface(self.catalog, config, model_id)
