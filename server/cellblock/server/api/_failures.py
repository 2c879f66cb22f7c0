"""Every failure of a ``cellblock.*`` RPC gets a documented status and message (SPEC §3.1 item 4).

:class:`FailureInterceptor` wraps every handler of the public services:

* a request that does not decode (invalid UTF-8 in a string field, a malformed field)
  ends with ``INVALID_ARGUMENT`` and [A01], for unary calls and for every message
  of a stream; grpc would otherwise answer ``UNKNOWN`` naming ``DecodeError``;
* a request (or the first message of a stream) with an id field longer than
  :data:`~cellblock.server.limits.MAX_SCOPE_ID_CHARS`, at any depth, ends with
  ``INVALID_ARGUMENT`` and [A03] before its handler runs (SPEC §3.1 item 5), so no
  handler logs or stores an unbounded id;
* a run-store call that did not answer within the store wait (RunService, scope end) ends
  with ``UNAVAILABLE`` and [A05] (SPEC §16.1 item 9);
* any other exception a handler raises (a fault of the service) is logged with its
  class and traceback and ends with ``INTERNAL`` and [A02]: never ``UNKNOWN`` with
  Python internals.

Aborts (``context.abort``) and cancellation pass through unchanged. A streamed message of more
than :data:`DEFERRED_DECODE_BYTES` is decoded in a loop turn of its own, after the one gRPC
received it in, and handed on in the next (SPEC §3.1 item 6): a 60 MB ``ToolResult`` was
received, decoded and its text read in one turn (about 130 ms at load 8).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
import structlog
from google.protobuf.message import DecodeError

from cellblock.server import messages as msg
from cellblock.server.api._scope import long_id
from cellblock.server.catalog import is_fault
from cellblock.server.limits import MAX_SCOPE_ID_CHARS
from cellblock.server.store import StoreTimeoutError

log = structlog.get_logger("cellblock.rpc")


class _Undecodable:
    """Stands for a request message that did not decode."""


_UNDECODABLE = _Undecodable()

#: Wire bytes of a streamed request message above which it is decoded in a loop turn of its own.
DEFERRED_DECODE_BYTES = 1 << 20


@dataclass(frozen=True)
class _Deferred:
    """A streamed request message's wire bytes, decoded later by the stream's reader (:func:`_stream`)."""

    data: bytes


@dataclass(frozen=True)
class WithWire:
    """A decoded request message and the wire bytes it was decoded from (:func:`keeping_wire`).

    For a handler that hands the request's megabytes to a worker process: reading a protobuf
    string field makes a new Python string, and one of 21 MB held the loop 10-60 ms
    (``PutCatalog``, SPEC §3.1 item 6). The interceptors read ``message`` as any request.

    Attributes:
        message: The decoded request.
        data: Its wire bytes.
    """

    message: Any
    data: bytes

    def __getattr__(self, name: str) -> Any:
        """The message's fields, so that interceptors read the request's ids as from any request."""
        if name in ("message", "data"):  # not set yet (a copy being built): no recursion
            raise AttributeError(name)
        return getattr(self.message, name)


def keeping_wire(deserializer: Callable[[bytes], Any]) -> Callable[[bytes], WithWire]:
    """A request deserializer that also keeps the wire bytes (:class:`WithWire`); decode errors propagate."""

    def decode(data: bytes) -> WithWire:
        return WithWire(deserializer(data), data)

    return decode


def _tolerant(deserializer: Callable[[bytes], Any] | None, defer: bool = False) -> Callable[[bytes], Any] | None:
    if deserializer is None:
        return None

    def decode(data: bytes) -> Any:
        if defer and len(data) > DEFERRED_DECODE_BYTES:
            return _Deferred(data)
        try:
            return deserializer(data)
        except (DecodeError, UnicodeDecodeError, ValueError, RecursionError):
            return _UNDECODABLE

    return decode


def _is_abort(exc: BaseException) -> bool:
    return isinstance(exc, grpc.aio.AbortError) or type(exc).__name__ == "AbortError"


async def _fail(context: grpc.aio.ServicerContext, exc: BaseException, rpc: str) -> None:
    if isinstance(exc, StoreTimeoutError):
        log.error("rpc.store_timeout", rpc=rpc, call=exc.call)
        await context.abort(grpc.StatusCode.UNAVAILABLE, msg.A05)
    log.error("rpc.fault", rpc=rpc, error_class=exc.__class__.__name__, error=str(exc)[:200], exc_info=True)
    await context.abort(grpc.StatusCode.INTERNAL, msg.A02)


class FailureInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]  # grpc ships no type information
    """Maps undecodable requests and handler faults to documented statuses (module docstring)."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        method = str(handler_call_details.method)
        if handler is None or not method.startswith("/cellblock.") or method.startswith("/cellblock.bridge."):
            return handler
        rpc = method.rsplit("/", 1)[-1]
        decode = _tolerant(handler.request_deserializer)
        if handler.request_streaming and handler.response_streaming:
            deferring = _tolerant(handler.request_deserializer, defer=True)
            return grpc.stream_stream_rpc_method_handler(_stream(handler.stream_stream, rpc, decode), request_deserializer=deferring, response_serializer=handler.response_serializer)
        if handler.request_streaming or handler.response_streaming:
            return handler
        return grpc.unary_unary_rpc_method_handler(_unary(handler.unary_unary, rpc), request_deserializer=decode, response_serializer=handler.response_serializer)


async def _check_ids(request: Any, context: grpc.aio.ServicerContext) -> None:
    field = long_id(request.message if isinstance(request, WithWire) else request)
    if field is not None:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, msg.a03(field, MAX_SCOPE_ID_CHARS))


def _unary(behavior: Any, rpc: str) -> Any:
    async def guarded(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if request is _UNDECODABLE:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, msg.A01)
        await _check_ids(request, context)
        try:
            return await behavior(request, context)
        except BaseException as exc:  # a Rust extension's panic too (catalog.is_fault)
            if _is_abort(exc) or not is_fault(exc):
                raise
            await _fail(context, exc, rpc)

    return guarded


def _stream(behavior: Any, rpc: str, decode: Callable[[bytes], Any] | None) -> Any:
    async def guarded(request_iterator: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        async def checked() -> AsyncIterator[Any]:
            first = True
            async for item in request_iterator:
                if isinstance(item, _Deferred) and decode is not None:
                    await asyncio.sleep(0)  # gRPC's receive was this turn: the decode gets the next
                    item = decode(item.data)
                    await asyncio.sleep(0)  # and the handler reads its fields in the one after
                if item is _UNDECODABLE:
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, msg.A01)
                if first:  # the start; a later ToolResult with a long nested_call_id is ignored (SPEC §3.1 item 5)
                    await _check_ids(item, context)
                    first = False
                yield item

        try:
            async for item in behavior(checked(), context):
                yield item
        except BaseException as exc:  # a Rust extension's panic too (catalog.is_fault)
            if _is_abort(exc) or not is_fault(exc):
                raise
            await _fail(context, exc, rpc)

    return guarded
