"""The ``CatalogService`` methods of `CellblockClient` (SPEC §3.2), and its unary-call plumbing.

`CellblockClient` inherits `CatalogCalls`; nothing here is used on its own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import grpc

from cellblock.client._errors import from_grpc_error
from cellblock.client._types import (
    Catalog,
    CatalogPage,
    CatalogSummary,
    CatalogTelemetry,
    DeleteCatalogResult,
    Scope,
    ScopeLike,
    Tool,
    _scope,
    _tools_to_proto,
)
from cellblock.v1 import catalog_service_pb2, catalog_service_pb2_grpc

__all__ = ["CatalogCalls"]


class CatalogCalls:
    """Catalog registration, lookup, listing and scope end; every call is one unary RPC."""

    _catalogs: catalog_service_pb2_grpc.CatalogServiceStub
    _rpc_timeout: float | None
    _metadata: tuple[tuple[str, str], ...]

    async def _unary(self, method: Any, request: Any) -> Any:
        """Calls one unary RPC with the client's deadline and metadata; gRPC errors become `RPCError`."""
        try:
            return await method(request, timeout=self._rpc_timeout, metadata=self._metadata)
        except grpc.RpcError as exc:
            raise from_grpc_error(exc) from None

    async def put_catalog(
        self,
        scope: ScopeLike,
        tools: Sequence[Tool | Mapping[str, Any]],
        *,
        mode: str = "replace",
        direct_tool_names: Sequence[str] = (),
        allow: Sequence[str] = (),
        deny: Sequence[str] = (),
    ) -> Catalog:
        """Registers or extends the scope's catalog. All-or-nothing.

        Args:
            scope: The owning scope.
            tools: `Tool` values or SPEC §3.2 dicts (camelCase keys); at most 10000.
            mode: ``"replace"`` (default; new catalog session, counters reset)
                or ``"merge"`` (add by id, keep counters).
            direct_tool_names: Host tool names to keep model-visible beside exec/wait.
            allow: When non-empty, only tools matching these whole ids or names enter.
            deny: Tools matching these whole ids or names never enter and cannot be called.

        Returns:
            The catalog as registered.

        Raises:
            ValueError: If a tool dict is malformed or ``mode`` is unknown (nothing is sent).
            InvalidArgumentError: If the service rejects a tool; the message names its index.
        """
        modes = {
            "replace": catalog_service_pb2.REGISTRATION_MODE_REPLACE,
            "merge": catalog_service_pb2.REGISTRATION_MODE_MERGE,
        }
        if mode not in modes:
            raise ValueError(f"mode must be 'replace' or 'merge', not {mode!r}")
        request = catalog_service_pb2.PutCatalogRequest(
            scope=_scope(scope)._to_proto(),
            tools=_tools_to_proto(tools),
            mode=modes[mode],
            direct_tool_names=list(direct_tool_names),
            allow=list(allow),
            deny=list(deny),
        )
        response = await self._unary(self._catalogs.PutCatalog, request)
        return Catalog._from_proto(response.catalog)

    async def get_catalog(self, scope: ScopeLike) -> Catalog:
        """Returns the scope's catalog.

        Args:
            scope: The owning scope.

        Returns:
            The catalog.

        Raises:
            NotFoundError: If the scope has no catalog.
        """
        request = catalog_service_pb2.GetCatalogRequest(scope=_scope(scope)._to_proto())
        response = await self._unary(self._catalogs.GetCatalog, request)
        return Catalog._from_proto(response.catalog)

    async def list_catalogs(self, session_id: str, *, page_size: int = 0, page_token: str = "") -> CatalogPage:
        """Lists one page of the catalogs of a session, ordered by agent run id.

        Args:
            session_id: The session whose catalogs to list.
            page_size: Maximum catalogs per page, 1..1000; 0 (default) means 100.
            page_token: ``next_page_token`` of the previous page; empty for the first.

        Returns:
            The page.

        Raises:
            InvalidArgumentError: If ``session_id`` is empty or the token is invalid.
        """
        request = catalog_service_pb2.ListCatalogsRequest(
            session_id=session_id, page_size=page_size, page_token=page_token
        )
        response = await self._unary(self._catalogs.ListCatalogs, request)
        return CatalogPage(
            catalogs=[
                CatalogSummary(scope=Scope._from_proto(c.scope), telemetry=CatalogTelemetry._from_proto(c.telemetry))
                for c in response.catalogs
            ],
            next_page_token=response.next_page_token,
        )

    async def delete_catalog(self, scope: ScopeLike) -> DeleteCatalogResult:
        """Ends the scope: aborts its legs, discards its suspended runs, drops the catalog.

        Idempotent: a scope without a catalog succeeds with zero counts. Handler
        tasks this client still runs for the scope's runs are cancelled.

        Args:
            scope: The scope to end.

        Returns:
            How many legs were aborted and runs discarded.
        """
        request = catalog_service_pb2.DeleteCatalogRequest(scope=_scope(scope)._to_proto())
        response = await self._unary(self._catalogs.DeleteCatalog, request)
        return DeleteCatalogResult(aborted_legs=response.aborted_legs, discarded_runs=response.discarded_runs)
