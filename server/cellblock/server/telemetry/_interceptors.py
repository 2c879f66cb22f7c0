"""Server interceptors: RPC spans (contrib) and canonical log lines.

:func:`server_interceptors` gives, outermost first:

1. the contrib ``opentelemetry-instrumentation-grpc`` aio server interceptor:
   one ``SERVER`` span per ``cellblock.*`` RPC named ``/<service>/<method>``,
   its parent the W3C ``traceparent`` of the caller's metadata (health and
   reflection are not traced);
2. :class:`CanonicalLogInterceptor`: the one canonical INFO line of each
   unary ``cellblock.*`` RPC (SPEC §13 item 1). Exec and Wait streams write
   their own, with the leg's status and code; the interceptor writes theirs
   only when the stream fails before a leg (an abort such as a missing start
   message or scope).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import structlog
from opentelemetry.instrumentation.grpc import aio_server_interceptor, filters

log = structlog.get_logger("cellblock.rpc")

#: Status codes the caller caused (SPEC §13 item 2: rejected input is a warning).
_CALLER_CODES = {
    grpc.StatusCode.CANCELLED,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.OUT_OF_RANGE,
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.ABORTED,
}


def request_ids(request: Any) -> dict[str, str]:
    """The identifiers a unary request carries: ``session_id``, ``agent_run_id``, ``run_id``.

    Only ids are read; nothing else of the request reaches the logs.
    """
    ids: dict[str, str] = {}
    scope = getattr(request, "scope", None)
    if scope is not None and scope.session_id:
        ids["session_id"] = scope.session_id[:_LOGGED_ID_CHARS]
        ids["agent_run_id"] = scope.agent_run_id[:_LOGGED_ID_CHARS]
    elif isinstance(getattr(request, "session_id", None), str) and request.session_id:
        ids["session_id"] = request.session_id[:_LOGGED_ID_CHARS]
    if isinstance(getattr(request, "run_id", None), str) and request.run_id:
        ids["run_id"] = request.run_id[:_LOGGED_ID_CHARS]
    return ids


#: Characters of an id copied into the canonical line: the API's id cap (SPEC §2.3); a longer
#: id is refused by the handler, and its line shows only this much of it.
_LOGGED_ID_CHARS = 256


def _status_code(context: grpc.aio.ServicerContext) -> grpc.StatusCode:
    code = context.code()
    if isinstance(code, grpc.StatusCode):
        return code
    return next((c for c in grpc.StatusCode if c.value[0] == code), grpc.StatusCode.UNKNOWN)


class CanonicalLogInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]  # grpc ships no type information
    """Writes one ``rpc.completed`` line per unary ``cellblock.*`` RPC.

    The line has ``rpc`` (method name), ``grpc_code``, ``duration_ms`` and the
    request's ids, bound as structlog context variables for the whole call so
    every record the RPC writes carries them. INFO when OK, WARNING for codes
    the caller caused, ERROR otherwise.
    """

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        method = str(handler_call_details.method)
        if handler is None or not method.startswith("/cellblock."):
            return handler
        name = method.rsplit("/", 1)[-1]
        if handler.request_streaming and handler.response_streaming:
            return self._stream_stream(handler, name)
        if handler.request_streaming or handler.response_streaming:
            return handler
        behavior = handler.unary_unary

        async def logged(request: Any, context: grpc.aio.ServicerContext) -> Any:
            structlog.contextvars.clear_contextvars()
            structlog.contextvars.bind_contextvars(rpc=name, **request_ids(request))
            started = time.monotonic()
            code = grpc.StatusCode.OK
            try:
                return await behavior(request, context)
            except asyncio.CancelledError:
                # The caller went away (its deadline or a cancel): not a fault of the service.
                code = grpc.StatusCode.CANCELLED
                raise
            except BaseException:
                code = _status_code(context)
                if code == grpc.StatusCode.OK:
                    code = grpc.StatusCode.UNKNOWN
                raise
            finally:
                level = "info" if code == grpc.StatusCode.OK else "warning" if code in _CALLER_CODES else "error"
                getattr(log, level)("rpc.completed", grpc_code=code.name, duration_ms=int((time.monotonic() - started) * 1000))

        return grpc.unary_unary_rpc_method_handler(logged, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer)

    @staticmethod
    def _stream_stream(handler: grpc.RpcMethodHandler, name: str) -> grpc.RpcMethodHandler:
        behavior = handler.stream_stream

        async def logged(request_iterator: Any, context: grpc.aio.ServicerContext) -> Any:
            structlog.contextvars.clear_contextvars()
            structlog.contextvars.bind_contextvars(rpc=name)
            started = time.monotonic()
            try:
                async for item in behavior(request_iterator, context):
                    yield item
            except Exception:
                # Aborts and faults; transport cancellation (a BaseException) is logged by the handler.
                code = _status_code(context)
                if code == grpc.StatusCode.OK:
                    code = grpc.StatusCode.UNKNOWN
                level = "warning" if code in _CALLER_CODES else "error"
                getattr(log, level)("rpc.completed", grpc_code=code.name, duration_ms=int((time.monotonic() - started) * 1000))
                raise

        return grpc.stream_stream_rpc_method_handler(logged, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer)


def server_interceptors() -> list[grpc.aio.ServerInterceptor]:
    """The service's interceptors, outermost first (module docstring)."""
    # The contrib interceptor is untyped.
    traced = aio_server_interceptor(filter_=filters.service_prefix("cellblock."))  # type: ignore[no-untyped-call]
    return [traced, CanonicalLogInterceptor()]
