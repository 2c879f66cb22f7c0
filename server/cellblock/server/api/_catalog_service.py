"""CatalogService: register and read scope catalogs (SPEC §3.2, §3.6)."""

from __future__ import annotations

import asyncio
import weakref
from typing import Any

import grpc

from cellblock.server import messages as msg
from cellblock.server.api._catalog_wire import catalog_response, register_in_worker, serialized
from cellblock.server.api._catalogs import PreparedView, ScopeCatalog, prepare_view
from cellblock.server.api._failures import WithWire, keeping_wire
from cellblock.server.api._scope import page_start, require_scope
from cellblock.server.api._state import ServiceState
from cellblock.server.catalog import CatalogRegistrationError, ParsedTools, parse_tools
from cellblock.server.config import Limits
from cellblock.server.limits import MAX_TOOLS_PER_REQUEST, REGISTRATION_BUDGET_MS, max_guest_catalog_bytes
from cellblock.server.runs import CancelReason, RunRegistry
from cellblock.server.workers import CpuPool, WorkBudgetExceeded, WorkerFailed, cpu_pool
from cellblock.v1 import catalog_service_pb2 as pb
from cellblock.v1 import catalog_service_pb2_grpc as pb_grpc
from cellblock.v1 import common_pb2


def telemetry_message(t: dict[str, Any]) -> common_pb2.CatalogTelemetry:
    """Converts result telemetry to its proto form."""
    return common_pb2.CatalogTelemetry(
        catalog_size=t["catalogSize"],
        host_count=t["sources"]["host"],
        mcp_count=t["sources"]["mcp"],
        client_count=t["sources"]["client"],
        search_count=t["searchCount"],
        describe_count=t["describeCount"],
        call_count=t["callCount"],
        counter_scope=t["counterScope"],
    )


_SERVICE = pb.DESCRIPTOR.services_by_name["CatalogService"].full_name


#: Tools the loop registers between two yields: about 3-8 ms of entries (hints, validators) on a loaded machine.
PARSE_SLICE = 25


async def parsed_in_slices(tools: list[dict[str, Any]]) -> ParsedTools:
    """The worker-checked ``tools`` parsed into entries, yielding the loop every :data:`PARSE_SLICE` tools.

    Building the entries of 1,500 host tools (their hints and validators) held the loop 170-220 ms
    at once (SPEC §3.1 item 6); the checks already ran in the worker, so nothing here refuses.

    Raises:
        CatalogRegistrationError: As :func:`parse_tools` (not for tools a worker checked).
    """
    parsed, seen = ParsedTools(), dict[str, int]()
    for first in range(0, len(tools), PARSE_SLICE):
        parsed += parse_tools(tools[first : first + PARSE_SLICE], check_schemas=False, copy=False, first=first, seen=seen)
        await asyncio.sleep(0)
    return parsed


class CatalogService(pb_grpc.CatalogServiceServicer):
    """Registers and reads catalogs (registered by :meth:`add_to_server`: ``PutCatalog`` and ``GetCatalog`` answer with bytes)."""

    def __init__(self, state: ServiceState, registry: RunRegistry, cpu: CpuPool | None = None) -> None:
        self._state = state
        self._registry = registry
        self._cpu = cpu or cpu_pool()
        # One registration or deletion of a scope at a time: they await worker calls, and a replace
        # finishing while an earlier merge was in its worker was lost (the merge stored the old catalog back).
        self._locks: weakref.WeakValueDictionary[tuple[str, str], asyncio.Lock] = weakref.WeakValueDictionary()

    def add_to_server(self, server: grpc.aio.Server) -> None:
        """Registers the service like the generated ``add_CatalogServiceServicer_to_server``.

        ``PutCatalog`` and ``GetCatalog`` answer with their response already serialized
        (``_catalog_wire.catalog_response``); ``PutCatalog`` keeps its request's wire bytes for the
        worker, which reads the tools from them (``_catalog_wire.register_in_worker``).
        """
        handlers = {
            "PutCatalog": grpc.unary_unary_rpc_method_handler(self.PutCatalog, request_deserializer=keeping_wire(pb.PutCatalogRequest.FromString), response_serializer=serialized),
            "GetCatalog": grpc.unary_unary_rpc_method_handler(self.GetCatalog, request_deserializer=pb.GetCatalogRequest.FromString, response_serializer=serialized),
            "ListCatalogs": grpc.unary_unary_rpc_method_handler(self.ListCatalogs, request_deserializer=pb.ListCatalogsRequest.FromString, response_serializer=serialized),
            "DeleteCatalog": grpc.unary_unary_rpc_method_handler(self.DeleteCatalog, request_deserializer=pb.DeleteCatalogRequest.FromString, response_serializer=serialized),
        }
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(_SERVICE, handlers),))
        server.add_registered_method_handlers(_SERVICE, handlers)

    def _scope_lock(self, scope: tuple[str, str]) -> asyncio.Lock:
        lock = self._locks.get(scope)
        if lock is None:
            lock = self._locks[scope] = asyncio.Lock()
        return lock

    async def PutCatalog(self, received: WithWire, context: grpc.aio.ServicerContext) -> bytes:  # type: ignore[override]  # noqa: N802
        """Registers a catalog (SPEC §3.2); the loop reads only the request's small fields (SPEC §3.1 item 6).

        The tools' texts (schemas, descriptions: megabytes) are read from the request's wire bytes
        in the worker: reading a 21 MB text field here copied it on the loop (10-60 ms).
        """
        request: pb.PutCatalogRequest = received.message
        scope = await require_scope(request.scope, context)
        if len(request.tools) > MAX_TOOLS_PER_REQUEST:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"at most {MAX_TOOLS_PER_REQUEST} tools per registration")
        async with self._scope_lock(scope):
            return await self._put(scope, request, received.data, context)

    async def _put(self, scope: tuple[str, str], request: pb.PutCatalogRequest, data: bytes, context: grpc.aio.ServicerContext) -> bytes:
        existing = self._state.catalogs.get(scope)
        merge = request.mode == pb.REGISTRATION_MODE_MERGE
        direct = list(request.direct_tool_names)
        allow = list(request.allow) if request.allow else None
        deny = list(request.deny) if request.deny else None
        try:
            target = existing if (existing is not None and merge) else ScopeCatalog(self._state.config)
            fresh = target is not existing
            if existing is not None and not merge:
                # A replace keeps the catalog object only if registration succeeds.
                target = ScopeCatalog(self._state.config)
            # Reading the tools, decoding the schema texts, the costly checks (metaschemas, $ref
            # targets), the answer's entries and, for a new catalog session, its hosted MCP entries
            # (SPEC §3.2 item 7) and the view's guest data and search model run in one worker call
            # within the registration budget; the loop then registers the decoded, checked tools
            # the worker hands back (SPEC §3.1 item 6, §3.2 item 3).
            size = len(data)
            problem, texts, tools, wire, start = await self._cpu.run(
                register_in_worker, data, self._state.hosted_tools(), fresh, direct, allow, deny, budget_s=REGISTRATION_BUDGET_MS / 1000.0, size=size, tenant=scope
            )
            if problem is not None:
                raise CatalogRegistrationError(*problem)
            # Registered into a fork, swapped in once prepared: a merge that fails changes nothing (SPEC §3.2 item 4).
            staged = target.catalog.fork()
            view = staged.register(await parsed_in_slices(tools), mode="merge" if merge else "replace", direct_tool_names=direct, allow=allow, deny=deny, check_schemas=False, copy=False)
            merged = existing is not None and not fresh
            schema_texts = {**target.schema_texts, **texts} if merged else texts
            entry_wire = {**target.entry_wire, **wire} if merged else wire
            total = size + (target.prepared_size if merge else 0)
            if start is not None:
                namespace, part, model, entries_json, catalog_bytes = start
                prepared = PreparedView(view, namespace, part, schema_texts, model, entries_json, catalog_bytes)
            else:
                prepared = await prepare_view(view, schema_texts, self._cpu, total, scope)
            bound = max_guest_catalog_bytes(Limits.default.memory_limit_bytes)
            if prepared.catalog_bytes > bound:
                # Every exec of the scope would fail R09 installing it (SPEC §3.2 item 8).
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, msg.c04(prepared.catalog_bytes, bound))
            target.catalog, target.schema_texts, target.entry_wire = staged, schema_texts, entry_wire
            target.set_prepared(prepared, total)
        except CatalogRegistrationError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except WorkBudgetExceeded:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, msg.c01(REGISTRATION_BUDGET_MS))
        except WorkerFailed:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, msg.C02)
        self._state.catalogs[scope] = target
        return await catalog_response(scope, target, telemetry_message(target.telemetry()))

    async def GetCatalog(self, request: pb.GetCatalogRequest, context: grpc.aio.ServicerContext) -> bytes:  # type: ignore[override]  # noqa: N802
        scope = await require_scope(request.scope, context)
        catalog = self._state.catalogs.get(scope)
        if catalog is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, "this scope has no catalog")
        assert catalog is not None
        return await catalog_response(scope, catalog, telemetry_message(catalog.telemetry()))

    async def ListCatalogs(self, request: pb.ListCatalogsRequest, context: grpc.aio.ServicerContext) -> pb.ListCatalogsResponse:  # noqa: N802
        if not request.session_id.strip():
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "session_id must be a non-empty string")
        scopes = sorted(s for s in self._state.catalogs if s[0] == request.session_id)
        size = request.page_size if 0 < request.page_size <= 1000 else 100
        start = await page_start(request.page_token, context)
        page = scopes[start : start + size]
        summaries = [
            pb.CatalogSummary(scope=common_pb2.Scope(session_id=s[0], agent_run_id=s[1]), telemetry=telemetry_message(self._state.catalogs[s].telemetry()))
            for s in page
        ]
        token = str(start + size) if start + size < len(scopes) else ""
        return pb.ListCatalogsResponse(catalogs=summaries, next_page_token=token)

    async def DeleteCatalog(self, request: pb.DeleteCatalogRequest, context: grpc.aio.ServicerContext) -> pb.DeleteCatalogResponse:  # noqa: N802
        scope = await require_scope(request.scope, context)
        async with self._scope_lock(scope):
            return await self._delete(scope)

    async def _delete(self, scope: tuple[str, str]) -> pb.DeleteCatalogResponse:
        aborted = 0
        for leg_scope, ports, _leg in list(self._state.active_legs.values()):
            if leg_scope == scope:
                ports.cancel(CancelReason.SCOPE)
                aborted += 1
        discarded = 0
        for run in await self._registry.of_scope(*scope):
            if run.state == "suspended" and await self._registry.discard(run.run_id):
                discarded += 1
        self._state.catalogs.pop(scope, None)
        if self._state.scope_cells is not None:
            # The scope's kept cells go with it (SPEC §16.2 item 2).
            self._state.scope_cells.end_scope(scope)
        return pb.DeleteCatalogResponse(aborted_legs=aborted, discarded_runs=discarded)
