"""Scope catalogs as the services and legs use them.

The catalog is wrapped once: :class:`RunCatalog` is the run's frozen
:class:`~cellblock.server.catalog.CatalogView` plus what a run's bridge requests need
from it (the guest's catalog data, search/describe answers, resolving nested calls
against the namespace map and the input contract, projecting tool results through the
output contract). It implements :class:`~cellblock.server.runs.CatalogPort`; the leg
reads it as ``run.view``. :class:`ScopeCatalog` is one scope's catalog session.
"""

from __future__ import annotations

import dataclasses
import json
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Literal

import structlog

from cellblock.server import messages as msg
from cellblock.server.catalog import (
    BridgeReplyError,
    Catalog,
    CatalogCounters,
    CatalogEntry,
    CatalogView,
    CounterSnapshot,
    McpNamespace,
    SchemaTexts,
    SurfaceDefinition,
    build_namespace,
    check_input_contract,
    check_output_contract,
    compact_json,
    entry_state,
    guest_data,
    search_model,
    strict_json,
    surface_definitions,
    view_from_state,
    view_state,
)
from cellblock.server.config import CodeModeConfig
from cellblock.server.limits import LARGE_JSON_BUDGET_MS, MAX_RESULT_DEPTH, REGISTRATION_BUDGET_MS
from cellblock.server.runs import BridgeMethod, JsonText, PreparedResult, ResolvedCall, ToolErrorKind, ToolOutcome, make_telemetry, portable, start_catalog_part
from cellblock.server.workers import CpuPool

log = structlog.get_logger("cellblock.leg")

StartData = tuple[McpNamespace, bytes, Any, bytes, int]
"""What :func:`start_data` builds in a worker: :class:`PreparedView`'s namespace, start part, search model, entries JSON, catalog bytes."""


def _telemetry(view: CatalogView, snap: CounterSnapshot) -> dict[str, Any]:
    """The result telemetry of SPEC §12 item 1 (key order of §10.5)."""
    return make_telemetry(
        catalog_size=view.size,
        sources=view.sources,
        search_count=snap.search_count,
        describe_count=snap.describe_count,
        call_count=snap.call_count,
        counter_scope=snap.counter_scope,
    )


@dataclass(frozen=True, eq=False)
class PreparedView:
    """What the loop serves one catalog version from, built off the loop at registration (SPEC §2.3).

    Bound to one :class:`~cellblock.server.catalog.CatalogView` object: a scope's next
    registration builds a new one, and a run only ever gets the one of its own view
    (:meth:`ScopeCatalog.view`), so no leg is sent another version's catalog.

    Attributes:
        view: The catalog view these were built from.
        namespace: Its ``MCP`` namespace and namespace map (SPEC §8.5).
        start_part: Its guest catalog as the serialized ``Start`` catalog part
            (``runs.start_catalog_part``): every leg sends these bytes as they are.
        schema_texts: The compact JSON of its entries' schemas (``tools.describe`` answers).
        search_model: The BM25 model of its guest entries (``catalog.search_model``).
        entries_json: The UTF-8 JSON of its entries' stored form (``catalog.view_state``'s
            ``entries``), for a parked run's document (:meth:`RunCatalog.state_parts`).
        catalog_bytes: Length of the guest catalog's UTF-8 JSON, the tail of ``start_part``.
        version: A random id of this preparation, written into a parked run's document: a
            resume on this replica finds the same preparation by it (:meth:`ScopeCatalog.restore_view`).
    """

    view: CatalogView
    namespace: McpNamespace
    start_part: bytes
    schema_texts: SchemaTexts
    search_model: Any
    entries_json: bytes
    catalog_bytes: int
    version: str = dataclasses.field(default_factory=lambda: secrets.token_hex(12))


class RunCatalog:
    """The catalog view one run keeps for all of its legs (SPEC §3.2 item 6).

    Args:
        view: The frozen catalog view.
        config: The deployment's code-mode configuration.
        prepared: What a worker process built for the view at registration
            (:func:`prepare_view`; its ``view`` must be ``view``); ``None`` builds it here.
        guest_catalog: The guest's catalog data of a run restored from the run store.
    """

    def __init__(self, view: CatalogView, config: CodeModeConfig, prepared: PreparedView | None = None, guest_catalog: dict[str, Any] | None = None) -> None:
        if prepared is not None and prepared.view is not view:
            raise ValueError("prepared data of another catalog view")
        self._view = view
        self._config = config
        self._prepared = prepared
        if guest_catalog is not None:
            self.__dict__["_guest_catalog"] = guest_catalog

    def to_state(self) -> dict[str, Any]:
        """The run's catalog as a JSON document for the run store (SPEC §10.7 item 2).

        The view, its catalog session and the guest's catalog data (``MCP`` map, ``API`` files).
        """
        return {"view": view_state(self._view), "guestCatalog": self.guest_catalog()}

    def state_parts(self) -> list[bytes | memoryview]:
        """:meth:`to_state` as UTF-8 JSON in parts to concatenate, from the worker's texts when the view was prepared.

        Tens of MB for a scope with large ``mcp`` schemas: serializing them on the event loop
        each time a run parked held it for about 0.5 s, and concatenating them 20-30 ms (SPEC
        §2.3 "loop hold"). Only the session's counters are written here.
        """
        prepared = self._prepared
        if prepared is None:
            return [_utf8_json(self.to_state())]
        session = view_state(CatalogView((), self._view.counters))
        del session["entries"]
        catalog = memoryview(prepared.start_part)[len(prepared.start_part) - prepared.catalog_bytes :]
        return [b'{"catalogVersion":"', prepared.version.encode(), b'","view":{"entries":', prepared.entries_json, b",", _utf8_json(session)[1:-1], b'},"guestCatalog":', catalog, b"}"]

    @classmethod
    def from_state(cls, state: Mapping[str, Any], config: CodeModeConfig, counters: CatalogCounters | None = None) -> RunCatalog:
        """Restores a :meth:`to_state` document.

        ``counters`` is the live session when this replica has the run's catalog session,
        else the stored one is restored.
        """
        guest = state["guestCatalog"]  # an earlier host's shape (declarations written out, no ``mcp.texts``) is rebuilt from the view
        return cls(view_from_state(state["view"], counters), config, guest_catalog=None if isinstance(guest.get("mcp"), dict) and "texts" not in guest["mcp"] else guest)

    @property
    def counter_scope(self) -> str:
        """The ``counterScope`` of the run's catalog session."""
        return self._view.counters.counter_scope

    def entry(self, entry_id: str) -> CatalogEntry | None:
        """The view's entry with this exact id (any source)."""
        return self._view.get(entry_id)

    def telemetry(self) -> dict[str, Any]:
        """Result telemetry from the run's own view and session.

        For a scope whose catalog this replica does not have (SPEC §12 item 1).
        """
        return _telemetry(self._view, self._view.counters.snapshot())

    @cached_property
    def namespace(self) -> McpNamespace:
        """The run's ``MCP`` namespace and namespace map (SPEC §8.5), computed once per view."""
        if self._prepared is not None:
            return self._prepared.namespace
        return build_namespace(self._view.entries)

    def start_catalog_part(self) -> bytes:
        """:meth:`guest_catalog` as the serialized ``Start`` catalog part, built once per view."""
        if self._prepared is not None:
            return self._prepared.start_part
        return self._start_part

    @cached_property
    def _start_part(self) -> bytes:
        # A run restored from the store: built here once, for all of its legs.
        return start_catalog_part(compact_json(self.guest_catalog()))

    def guest_catalog(self) -> dict[str, Any]:
        """The data the cell installs (SPEC §8.1, §8.5, §8.6).

        ``allTools``, ``convenience``, ``mcp`` (``None`` without ``mcp`` entries) and
        ``apiFiles``. Computed once per run; treat it as read-only.
        """
        return self._guest_catalog

    @cached_property
    def _guest_catalog(self) -> dict[str, Any]:
        mcp, files = self.namespace.guest_data()
        return {"allTools": self._view.all_tools(), "convenience": self._view.convenience_names(), "mcp": mcp, "apiFiles": files}

    def namespace_entry(self, root: object, path: object) -> CatalogEntry | None:
        """The entry a ``namespace`` request targets (SPEC §8.5 item 7).

        ``None`` when ``[root, path]`` is not in the run's namespace map.
        """
        if root != "MCP" or not isinstance(path, str):
            return None
        entry_id = self.namespace.paths.get(path)
        return None if entry_id is None else self._view.get(entry_id)

    def search(self, query: object, options: object) -> list[dict[str, Any]]:
        """``tools.search`` (SPEC §7.5). Raises BridgeReplyError."""
        return self._view.search(query, options, config=self._config)

    def describe_json(self, text: object) -> str:
        """``tools.describe`` (SPEC §8.3 item 2) as compact JSON. Raises BridgeReplyError.

        Put together from the schema texts a worker wrote for this view at registration,
        when there are some (megabytes of schema are not serialized on the loop again).
        """
        entry = self._view.describe_entry(text)
        texts = self._prepared.schema_texts.get(entry.id) if self._prepared is not None else None
        return entry.describe_json(texts)

    def resolve_call(self, method: str, args: list[object]) -> ResolvedCall:
        """Resolves a nested call and checks its input contract.

        ``namespace`` calls reach only paths in the run's namespace map, by exact
        catalog id (SPEC §8.5 item 7); ``call``/``callValue`` resolve their id text
        (SPEC §7.6). Both check the input contract (SPEC §8.4 item 1).

        Args:
            method: ``call``, ``callValue`` or ``namespace``.
            args: The request's arguments.

        Raises:
            BridgeReplyError: Unknown/ambiguous tool, bad id type, unknown namespace
                path [P04], non-object namespace input [B14], input contract [B10].
        """
        if method == BridgeMethod.NAMESPACE:
            path = args[1] if len(args) > 1 else ""
            entry = self.namespace_entry(args[0] if args else None, path)
            if entry is None:
                log.error("bridge.protocol", message=msg.p04(str(path)))
                raise BridgeReplyError(msg.p04(str(path)), "internal")
            label = f"MCP.{path}"
            tool_input = args[2] if len(args) > 2 else {}
            if not (isinstance(tool_input, dict) or (isinstance(tool_input, JsonText) and tool_input.is_object)):
                # The controller refuses these itself (B14); a forged request gets the same reply.
                raise BridgeReplyError(msg.b14(label), "input")
            return ResolvedCall(entry=entry, input=tool_input, replay_safe=False, label=label)
        helper: Literal["tools.call", "tools.callValue"] = "tools.call" if method == BridgeMethod.CALL else "tools.callValue"
        tool_id = args[0] if args else None
        entry = self._view.resolve(tool_id, helper)
        tool_input = args[1] if len(args) > 1 else {}
        # A long input a worker read is checked in a worker too, before the call can go out (the leg does it).
        unchecked = isinstance(tool_input, JsonText) and entry.input_validator is not None
        if not unchecked:
            check_input_contract(entry, tool_input)
        return ResolvedCall(entry=entry, input=tool_input, replay_safe=self.is_replay_safe_call(entry, tool_id), label=entry.id, input_unchecked=unchecked)

    def project_result(self, method: str, call: ResolvedCall, outcome: ToolOutcome, inbox_bytes: int) -> object:
        """Turns a tool outcome into the value the guest receives.

        A failure becomes its reply (SPEC §3.5 item 5, [B09], [B11], [B19]); a result
        larger than the reply inbox is refused [B12]; the output contract is checked
        (SPEC §8.4 item 2); ``call`` wraps the result with its compact entry and
        ``callValue`` unwraps MCP ``details``.

        Raises:
            BridgeReplyError: Failure replies, oversized or malformed results, output
                contract violations.
        """
        entry, label = call.entry, call.label  # in tool messages <id> is the guest path for namespace calls (SPEC §14)
        if outcome.oversized_bytes > 0:
            raise BridgeReplyError(msg.b12(label, outcome.oversized_bytes, inbox_bytes), "internal")
        if outcome.ok_json is None:
            kind = outcome.error_kind
            if kind == ToolErrorKind.INVALID_INPUT:
                raise BridgeReplyError(outcome.error_message, "input")
            if kind == ToolErrorKind.BLOCKED:
                raise BridgeReplyError(msg.b09(label, outcome.error_message), "internal")
            if kind == ToolErrorKind.CANCELLED:
                raise BridgeReplyError(msg.b19(label), "internal")
            raise BridgeReplyError(outcome.error_message or msg.b11(label), "internal")
        prepared = outcome.prepared
        if prepared is not None:
            return _project_prepared(method, call, prepared, inbox_bytes, outcome.ok_json)
        size = len(outcome.ok_json.encode("utf-8", "surrogatepass"))
        if size > inbox_bytes:
            raise BridgeReplyError(msg.b12(label, size, inbox_bytes), "internal")
        try:
            result = strict_json(outcome.ok_json, MAX_RESULT_DEPTH)
        except (ValueError, RecursionError) as exc:
            raise BridgeReplyError(msg.b29(label) if isinstance(exc, RecursionError) else msg.not_json(label), "internal") from None
        check_output_contract(entry, result)
        if method == BridgeMethod.CALL:
            return {"tool": entry.compact(), "result": result}
        if method == BridgeMethod.CALL_VALUE and isinstance(result, dict) and "details" in result:
            return result["details"]
        return result

    def count_call(self, requests: int = 1) -> None:
        """Counts ``requests`` nested call requests in the view's catalog session."""
        self._view.counters.count_call(requests)

    @staticmethod
    def is_replay_safe_call(entry: CatalogEntry, text: object) -> bool:
        """SPEC §10.8 item 1: exact host id, replaySafe and not sideEffecting."""
        return entry.source == "host" and text == entry.id and entry.replay_safe and not entry.side_effecting


def _project_prepared(method: str, call: ResolvedCall, prepared: PreparedResult, inbox_bytes: int, ok_json: str) -> object:
    """:meth:`RunCatalog.project_result` of a long result a worker read (``runs.PreparedResult``), as compact JSON text.

    Same checks in the same order: the reply inbox [B12], a worker over its budget [B26], JSON the host reads, the output
    contract [B08] (checked on the loop only when the worker could not know the entry: a
    result that arrived on another leg's stream than its call), then the ``call`` envelope
    or the ``callValue`` unwrapping of ``details``.
    """
    entry, label = call.entry, call.label
    if prepared.size > inbox_bytes:
        raise BridgeReplyError(msg.b12(label, prepared.size, inbox_bytes), "internal")
    if prepared.overran:
        raise BridgeReplyError(msg.b26(label, len(ok_json), LARGE_JSON_BUDGET_MS), "internal")
    if prepared.too_deep:
        raise BridgeReplyError(msg.b29(label), "internal")
    if not prepared.valid:
        raise BridgeReplyError(msg.not_json(label), "internal")
    if entry.output_validator is not None:
        if prepared.contract is None or prepared.contract[0] != entry.id:
            check_output_contract(entry, strict_json(ok_json))
        elif not prepared.contract[1]:
            raise BridgeReplyError(msg.b08(entry.id), "internal")
    result = ok_json if prepared.same else prepared.result
    if method == BridgeMethod.CALL:
        return JsonText(f'{{"tool":{compact_json(entry.compact())},"result":{result}}}', True)
    if method == BridgeMethod.CALL_VALUE and prepared.details is not None:
        return JsonText(prepared.details, prepared.details.startswith("{"))
    return JsonText(result, result.startswith("{"))


def _utf8_json(value: Any) -> bytes:
    """JSON as the run store writes it (``runs._codec``): compact, non-ASCII kept, lone surrogates passed."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogatepass")


def start_data(entries: Sequence[CatalogEntry], all_tools: list[dict[str, Any]], convenience: dict[str, str]) -> StartData:
    """Worker side of :func:`prepare_view`: namespace, ``Start`` catalog part, search model, stored entries, catalog bytes."""
    namespace, catalog_json = guest_data([e for e in entries if e.source == "mcp"], all_tools, convenience)
    model = search_model([e for e in entries if e.source != "mcp"])
    return namespace, start_catalog_part(catalog_json), model, _utf8_json([entry_state(e) for e in entries]), len(catalog_json.encode("utf-8"))


async def prepare_view(view: CatalogView, schema_texts: SchemaTexts, cpu: CpuPool, size: int, scope: tuple[str, str]) -> PreparedView:
    """Builds a view's namespace and ``Start`` catalog part in a worker process (SPEC §8.5, §8.6, §2.3).

    Args:
        view: The catalog view just registered.
        schema_texts: The compact JSON of its entries' schemas (from ``registration_problem``).
        cpu: The worker pool.
        size: Estimates the catalog's registered text in characters (it picks the lane).
        scope: The registering scope (its share of the worker pool).

    Raises:
        WorkBudgetExceeded: It took longer than the registration budget.
        WorkerFailed: The worker died.
    """
    entries = [portable(entry) for entry in view.entries]
    namespace, part, model, entries_json, catalog_bytes = await cpu.run(start_data, entries, view.all_tools(), view.convenience_names(), budget_s=REGISTRATION_BUDGET_MS / 1000.0, size=size, tenant=scope)
    return PreparedView(view, namespace, part, schema_texts, model, entries_json, catalog_bytes)


class ScopeCatalog:
    """One scope's catalog session."""

    def __init__(self, config: CodeModeConfig) -> None:
        self.catalog = Catalog()
        self._config = config
        self._prepared: PreparedView | None = None
        #: Characters of registered text behind the current view (picks the worker lane).
        self.prepared_size = 0
        self.schema_texts: SchemaTexts = {}
        """Compact JSON of each entry's schemas, written in the worker at registration (``_catalog_message``)."""
        self.entry_wire: dict[str, bytes] = {}
        """Each registered entry's serialized ``Catalog.entries`` field, written in the worker (``_catalog_wire``)."""
        self._surfaces: tuple[CatalogView | None, dict[bool, list[SurfaceDefinition]]] = (None, {})
        self._surface_responses: tuple[CatalogView | None, dict[bool, bytes]] = (None, {})

    def set_prepared(self, prepared: PreparedView, size: int = 0) -> None:
        """Keeps what a worker built for ``prepared.view`` while that is still the catalog's current view."""
        if prepared.view is not self.catalog.view:
            return  # a later registration of this scope finished first
        prepared.view.adopt_search_model(prepared.search_model)
        self._prepared = prepared
        self.prepared_size = size

    def view(self) -> RunCatalog:
        """A frozen view for a new run, with what was prepared for exactly this view (else none)."""
        view = self.catalog.view
        prepared = self._prepared if self._prepared is not None and self._prepared.view is view else None
        return RunCatalog(view, self._config, prepared)

    def restore_view(self, state: Mapping[str, Any]) -> RunCatalog:
        """A stored run's view, counting in this session when it is the run's own.

        A run parked from this scope's current preparation (its document names the
        preparation's random ``catalogVersion``) gets that exact view and preparation back, so
        its legs do not rebuild megabytes of ``Start`` catalog, describe texts or search index
        on the event loop (SPEC §2.3); any other run is restored from its document.
        """
        prepared = self._prepared
        if prepared is not None and state.get("catalogVersion") == prepared.version:
            return RunCatalog(prepared.view, self._config, prepared)
        live = self.catalog.counters
        return RunCatalog.from_state(state, self._config, live if live.counter_scope == state["view"]["counterScope"] else None)

    def telemetry(self) -> dict[str, Any]:
        """The result telemetry of SPEC §12 item 1 (key order of §10.5)."""
        return _telemetry(self.catalog.view, self.catalog.counters.snapshot())

    def tool_surface(self, config: CodeModeConfig, model_id: str | None) -> tuple[bool, list[SurfaceDefinition]]:
        """The model-visible tools as ``GetToolSurface`` sends them (SPEC §3.3), kept per catalog version.

        The engaged and the plain surface of the current view are each built once, from the
        schema texts the worker wrote at registration: a surface of 100 schemas of 390 KB
        held the event loop 480 ms per request when it was copied and serialized each time
        (SPEC §3.1 item 6). ``config`` is the service's, the same for every call.
        """
        view = self.catalog.view
        cached_view, surfaces = self._surfaces
        if cached_view is not view:
            surfaces = {}
            self._surfaces = (view, surfaces)
        engaged = config.engaged(model_id, view.size > 0)
        if engaged not in surfaces:
            surfaces[engaged] = surface_definitions(view, config, model_id, self.schema_texts)[1]
        return engaged, surfaces[engaged]

    def surface_response(self, view: CatalogView, engaged: bool) -> bytes | None:
        """The serialized ``GetToolSurface`` response kept for ``view`` (the current one) and ``engaged``, if any."""
        kept_view, responses = self._surface_responses
        return responses.get(engaged) if kept_view is view and view is self.catalog.view else None

    def keep_surface_response(self, view: CatalogView, engaged: bool, data: bytes) -> None:
        """Keeps a serialized ``GetToolSurface`` response of ``view``, while it is still the current version."""
        if view is not self.catalog.view:
            return  # registered again while it was built
        if self._surface_responses[0] is not view:
            self._surface_responses = (view, {})
        self._surface_responses[1][engaged] = data
