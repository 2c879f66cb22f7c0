"""A scope's catalog session and the immutable views runs keep (SPEC §3.2, §7.1)."""

from __future__ import annotations

import secrets
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from types import MappingProxyType
from typing import Any

from ..config import CodeModeConfig
from ._convenience import convenience_names
from ._entries import SOURCES, CatalogEntry
from ._identifiers import server_identifiers
from ._lookup import GuestLookup, Helper
from ._quick_index import quick_index
from ._registration import CONTROL_TOOL_NAMES, ParsedTools, RegisteredTool, parse_mode, parse_name_list, parse_tools
from ._search import SearchIndex
from ._text import deep_copy

__all__ = ["Catalog", "CatalogCounters", "CatalogView", "CounterSnapshot"]

_MODEL_TOOL_NAMES = ("exec", "wait")


@dataclass(frozen=True)
class CounterSnapshot:
    """A closed copy of a catalog session's counters (SPEC §12 item 1)."""

    counter_scope: str
    """12 lower-case hex digits naming the counter lifetime."""
    search_count: int
    """``tools.search`` requests in the session."""
    describe_count: int
    """``tools.describe`` requests in the session."""
    call_count: int
    """Call requests (``call``, ``callValue``, convenience and namespace calls) in the session."""


class CatalogCounters:
    """The cumulative counters of one catalog session; shared by all its views.

    ``replace`` starts a new session (new :attr:`counter_scope`, counters at 0); ``merge``
    keeps it. Thread-safe.
    """

    def __init__(self) -> None:
        """Starts a session with a random :attr:`counter_scope` and zero counts."""
        self.counter_scope: str = secrets.token_hex(6)
        self._lock = threading.Lock()
        self._search = 0
        self._describe = 0
        self._call = 0

    @classmethod
    def restored(cls, counter_scope: str, search: int, describe: int, call: int) -> CatalogCounters:
        """A session brought back from the run store with its scope and counts."""
        counters = cls()
        counters.counter_scope = counter_scope
        counters._search, counters._describe, counters._call = search, describe, call
        return counters

    def count_search(self) -> None:
        """Counts one ``tools.search`` request."""
        with self._lock:
            self._search += 1

    def count_describe(self) -> None:
        """Counts one ``tools.describe`` request."""
        with self._lock:
            self._describe += 1

    def count_call(self, requests: int = 1) -> None:
        """Counts ``requests`` call requests, whatever their outcome (SPEC §8.3 item 5)."""
        with self._lock:
            self._call += requests

    def snapshot(self) -> CounterSnapshot:
        """Returns a closed copy of the counters."""
        with self._lock:
            return CounterSnapshot(self.counter_scope, self._search, self._describe, self._call)


class CatalogView:
    """An immutable snapshot of a catalog, kept by each run for its whole life (SPEC §3.2 item 6).

    Everything guest-facing (``ALL_TOOLS``, search, describe, lookup, convenience names) uses
    only the guest view: the ``host`` and ``client`` entries (SPEC §7.1 item 6).
    """

    def __init__(
        self,
        entries: Sequence[CatalogEntry],
        counters: CatalogCounters,
        direct_tools: Sequence[Mapping[str, Any]] = (),
        registered_tools: Sequence[Mapping[str, Any]] = (),
        surface_ids: tuple[Sequence[str], Sequence[str]] = ((), ()),
    ) -> None:
        """Builds a view; normally obtained from :attr:`Catalog.view`.

        Args:
            entries: Catalog entries (any order; kept sorted by id).
            counters: The session counters the view's requests increment.
            direct_tools: Registered tool dicts shown directly on an engaged surface.
            registered_tools: Every registered tool dict, for a surface that is not engaged.
                Both are kept as given, not copied: the caller hands them over and never mutates them.
            surface_ids: The catalog ids of ``direct_tools`` and of ``registered_tools``, in
                the same order (empty for a view restored from a run's document): the tool
                surface finds each one's schema text by it (:meth:`surface_tools`).
        """
        self._entries = tuple(sorted(entries, key=lambda entry: entry.id))
        self._by_id = MappingProxyType({entry.id: entry for entry in self._entries})
        self._guest = tuple(entry for entry in self._entries if entry.source != "mcp")
        self._counters = counters
        # The raw tools are the catalog's own copies (made once at registration, never
        # mutated); callers get deep copies from direct_tools() / registered_tools().
        self._direct_tools = tuple(dict(tool) for tool in direct_tools)
        self._registered_tools = tuple(dict(tool) for tool in registered_tools)
        self._surface_ids = (tuple(surface_ids[0]), tuple(surface_ids[1]))

    def surface_tools(self, engaged: bool) -> list[tuple[str | None, Mapping[str, Any]]]:
        """The tools of a surface as ``(catalog id or None, registered tool)``, not copied: read them only.

        ``engaged`` gives :meth:`direct_tools`' tools, else :meth:`registered_tools`' (SPEC §3.3).
        The id is ``None`` when the view does not know it (a view restored from a run's document).
        """
        tools = self._direct_tools if engaged else self._registered_tools
        ids = self._surface_ids[0 if engaged else 1]
        return list(zip(ids, tools, strict=True)) if len(ids) == len(tools) else [(None, tool) for tool in tools]

    @property
    def entries(self) -> tuple[CatalogEntry, ...]:
        """Every catalog entry, in id order."""
        return self._entries

    @property
    def guest_entries(self) -> tuple[CatalogEntry, ...]:
        """The guest view: ``host`` and ``client`` entries, in id order."""
        return self._guest

    @property
    def counters(self) -> CatalogCounters:
        """The catalog session's counters."""
        return self._counters

    @property
    def size(self) -> int:
        """Number of catalog entries (``catalogSize``), ``mcp`` included."""
        return len(self._entries)

    @property
    def sources(self) -> dict[str, int]:
        """Entries by source: ``{"host": n, "mcp": n, "client": n}``."""
        return {source: sum(1 for e in self._entries if e.source == source) for source in SOURCES}

    @property
    def has_host(self) -> bool:
        """Whether the catalog has a ``host`` entry."""
        return any(entry.source == "host" for entry in self._entries)

    @property
    def has_mcp(self) -> bool:
        """Whether the catalog has an ``mcp`` entry."""
        return any(entry.source == "mcp" for entry in self._entries)

    def get(self, entry_id: str) -> CatalogEntry | None:
        """Returns the entry with this exact id (any source), or ``None``."""
        return self._by_id.get(entry_id)

    def direct_tools(self) -> list[dict[str, Any]]:
        """Returns the direct tools of an engaged surface (SPEC §3.3 item 2), as registered.

        Returns:
            Copies of the registered tool dicts: every ``directOnly`` tool and every ``host``
            entry named in ``directToolNames``, never one named ``exec`` or ``wait``; in id
            order, one per name (the first by id).
        """
        return deep_copy(list(self._direct_tools))

    def registered_tools(self) -> list[dict[str, Any]]:
        """Returns every registered tool, unchanged, for a surface that is not engaged."""
        return deep_copy(list(self._registered_tools))

    def all_tools(self) -> list[dict[str, Any]]:
        """Returns ``ALL_TOOLS``: compact entries of the guest view in id order (SPEC §8.1)."""
        return [entry.compact() for entry in self._guest]

    @cached_property
    def _search_index(self) -> SearchIndex:
        return SearchIndex(self._guest)

    def adopt_search_model(self, model: Any) -> None:
        """Serves ``tools.search`` with ``model``, :func:`search_model` of :attr:`guest_entries` built elsewhere.

        The service builds it in a worker process at registration: tokenizing megabytes of
        descriptions held the event loop for hundreds of ms at the view's first search (SPEC
        §2.3 "loop hold"). Does nothing once the view has searched.
        """
        if "_search_index" not in self.__dict__:
            self.__dict__["_search_index"] = SearchIndex(self._guest, model)

    @cached_property
    def _lookup(self) -> GuestLookup:
        return GuestLookup(self._guest)

    def search(self, query: object, options: object = None, *, config: CodeModeConfig) -> list[dict[str, Any]]:
        """Serves ``tools.search(query, options)`` and counts it (SPEC §7.5).

        Args:
            query: The guest's query; must be a string.
            options: ``None`` or a JSON object with an optional positive integer ``limit``.
            config: Supplies ``searchDefaultLimit`` and ``maxSearchLimit``.

        Returns:
            Compact entries, best first.

        Raises:
            BridgeReplyError: [B01], [B28], [B02] or [B03], with input provenance.
        """
        self._counters.count_search()
        return self._search_index.search(
            query, options, default_limit=config.search_default_limit, max_limit=config.max_search_limit
        )

    def rank(self, query: str) -> list[CatalogEntry]:
        """Returns every search result of ``query`` in rank order, without a limit or counting."""
        return self._search_index.rank(query)

    def describe(self, text: object) -> dict[str, Any]:
        """Serves ``tools.describe(id)`` and counts it (SPEC §8.3 item 2).

        Args:
            text: The guest's id text (an id or a unique name).

        Returns:
            The entry with schemas (SPEC §7.2 item 4).

        Raises:
            BridgeReplyError: [B04] (input provenance), [B06] or [B07].
        """
        return self.describe_entry(text).describe()

    def describe_entry(self, text: object) -> CatalogEntry:
        """Resolves ``tools.describe(id)``'s entry and counts the request (SPEC §8.3 item 2).

        The caller answers with :meth:`CatalogEntry.describe_json`.

        Raises:
            BridgeReplyError: [B04] (input provenance), [B06] or [B07].
        """
        self._counters.count_describe()
        return self._lookup.resolve(text, "tools.describe")

    def resolve(self, text: object, helper: Helper = "tools.call") -> CatalogEntry:
        """Resolves an id text in the guest view, without counting (SPEC §7.6).

        Args:
            text: The guest's id text.
            helper: ``tools.describe``, ``tools.call`` or ``tools.callValue`` (for [B04]/[B05]).

        Returns:
            The entry.

        Raises:
            BridgeReplyError: [B04]/[B05] (input provenance), [B06] or [B07].
        """
        return self._lookup.resolve(text, helper)

    def convenience_names(self) -> dict[str, str]:
        """Returns the convenience functions to install: safe name → exact id (SPEC §7.7)."""
        return convenience_names(self._guest)

    def mcp_servers(self) -> dict[str, str]:
        """Returns the MCP servers: server name → identifier, in server-name order (SPEC §8.5)."""
        return server_identifiers(entry.owner for entry in self._entries if entry.source == "mcp")

    @cached_property
    def quick_index(self) -> str | None:
        """The quick-index block (SPEC §4.4), or ``None`` without ``host`` entries."""
        return quick_index(self._entries)


def _matches(items: Sequence[str], tool: RegisteredTool) -> bool:
    return tool.entry.id in items or tool.entry.name in items


@dataclass(frozen=True)
class _Record:
    tool: RegisteredTool
    catalogued: bool
    direct: bool


class Catalog:
    """One scope's catalog session: registration, exclusions, counters and views.

    Registration is all-or-nothing. Runs take :attr:`view` when they start and keep it.
    """

    def __init__(self) -> None:
        """Creates an empty catalog with a fresh catalog session."""
        self._records: dict[str, _Record] = {}
        self._direct_names: tuple[str, ...] = ()
        self._counters = CatalogCounters()
        self._view = CatalogView((), self._counters)
        self._ignored: tuple[tuple[int, str, str], ...] = ()
        self._lock = threading.Lock()

    def fork(self) -> Catalog:
        """A catalog with this one's registrations and session, to register into without changing this one.

        ``PutCatalog`` merges into a fork and swaps it in only once the new version is
        prepared: a merge that then fails leaves the scope's catalog as it was (SPEC §3.2 item 4).
        """
        fork = Catalog()
        with self._lock:
            fork._records, fork._direct_names, fork._counters, fork._view, fork._ignored = self._records, self._direct_names, self._counters, self._view, self._ignored
        return fork

    @property
    def view(self) -> CatalogView:
        """The current immutable view."""
        return self._view

    @property
    def counters(self) -> CatalogCounters:
        """The current catalog session's counters."""
        return self._counters

    def registered_entries(self) -> list[CatalogEntry]:
        """The entry of every registered tool, catalogued or not (direct-only, denied, not allowed)."""
        return [record.tool.entry for record in self._records.values()]

    @property
    def ignored_fields(self) -> tuple[tuple[int, str, str], ...]:
        """Fields the last registration ignored, as ``(tool index, tool id, field)``.

        ``outputSchema`` is honoured only for ``host`` tools (SPEC §3.2 item 2); the caller
        logs these.
        """
        return self._ignored

    def register(
        self,
        tools: object,
        *,
        mode: object = "replace",
        direct_tool_names: object = None,
        allow: object = None,
        deny: object = None,
        check_schemas: bool = True,
        copy: bool = True,
    ) -> CatalogView:
        """Registers or extends the catalog (SPEC §3.2, §7.1).

        Exclusions: ``directOnly`` tools (unless named ``exec`` or ``wait``, which are
        catalogued instead), tools named ``tool_search_code``, ``tool_search``,
        ``tool_describe`` or ``tool_call``, tools matched by ``deny``, and tools not matched
        by ``allow`` when ``allow`` is given (``None`` means not given; an empty list allows
        nothing). Items match a whole id or a whole name. ``allow`` and ``deny`` apply to the
        tools of this registration; ``directToolNames`` accumulate over ``merge``
        registrations. ``directOnly`` tools stay visible whatever ``allow`` and ``deny`` say.

        Args:
            tools: The tools, as described in :func:`parse_tools`, or :class:`ParsedTools`
                (already validated: the service parses in slices, yielding the loop between them).
            mode: ``"replace"`` (default; new catalog session: new ``counterScope``, counters
                at 0) or ``"merge"`` (entries added by id, a later one replacing one with the
                same id; counters and ``counterScope`` kept).
            direct_tool_names: Ids or names of ``host`` entries also shown directly.
            allow: Ids or names allowed into the catalog, or ``None``.
            deny: Ids or names kept out of the catalog, or ``None``.
            check_schemas: Check ``host`` schemas against their metaschemas; ``False`` only
                when a worker process already registered the same tools
                (:func:`~cellblock.server.catalog._offload.registration_problem`).
            copy: Keep deep copies of the tools (default); ``False`` when the caller hands
                over data nobody else holds (``PutCatalog``'s freshly decoded tools), which
                saves copying megabytes of schema on the shared event loop.

        Returns:
            The new view.

        Raises:
            CatalogRegistrationError: A tool is invalid, two tools share an id, or a
                registration field is malformed; nothing is applied.
        """
        parsed_mode = parse_mode(mode)
        direct_names = parse_name_list(direct_tool_names, "directToolNames") or ()
        allowed = parse_name_list(allow, "allow")
        denied = parse_name_list(deny, "deny") or ()
        parsed = tools if isinstance(tools, ParsedTools) else parse_tools(tools, check_schemas=check_schemas, copy=copy)

        fresh: dict[str, _Record] = {}
        for tool in parsed:
            model_named = tool.entry.name in _MODEL_TOOL_NAMES
            if tool.direct_only and not model_named:
                fresh[tool.entry.id] = _Record(tool, catalogued=False, direct=True)
                continue
            excluded = (
                tool.entry.name in CONTROL_TOOL_NAMES
                or _matches(denied, tool)
                or (allowed is not None and not _matches(allowed, tool))
            )
            fresh[tool.entry.id] = _Record(tool, catalogued=not excluded, direct=False)

        with self._lock:
            if parsed_mode == "replace":
                records = fresh
                names = tuple(dict.fromkeys(direct_names))
                counters = CatalogCounters()
            else:
                records = {**self._records, **fresh}
                names = tuple(dict.fromkeys(self._direct_names + direct_names))
                counters = self._counters
            view = _build_view(records, names, counters)
            self._records, self._direct_names, self._counters, self._view = records, names, counters, view
            self._ignored = tuple((t.index, t.entry.id, name) for t in parsed for name in t.ignored)
        return view


def _build_view(records: Mapping[str, _Record], direct_names: Sequence[str], counters: CatalogCounters) -> CatalogView:
    entries = [record.tool.entry for record in records.values() if record.catalogued]
    direct: list[RegisteredTool] = []
    for record in sorted(records.values(), key=lambda record: record.tool.entry.id):
        entry = record.tool.entry
        promoted = (
            record.catalogued
            and entry.source == "host"
            and entry.name not in _MODEL_TOOL_NAMES
            and _matches(direct_names, record.tool)
        )
        if record.direct or promoted:
            direct.append(record.tool)
    seen_names: set[str] = set()
    direct_tools, direct_ids = [], []
    for tool in direct:
        if tool.entry.name not in seen_names:
            seen_names.add(tool.entry.name)
            direct_tools.append(tool.raw)
            direct_ids.append(tool.entry.id)
    registered = [record.tool.raw for record in records.values()]
    return CatalogView(entries, counters, direct_tools, registered, (direct_ids, [record.tool.entry.id for record in records.values()]))
