"""One ``Exec`` or ``Wait`` stream of the client: a reader and a writer task over queues.

No task of the caller ever awaits grpc directly: cancelling the caller (or a handler) never
tears down the transport before the ``Cancel`` message is sent.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, Generic, TypeAlias, TypeVar

import grpc
import grpc.aio

from cellblock.client._errors import ProtocolError, from_grpc_error
from cellblock.v1 import code_mode_service_pb2

__all__ = ["EOF", "Closed", "LegStream"]

_Req = TypeVar("_Req", code_mode_service_pb2.ExecRequest, code_mode_service_pb2.WaitRequest)
_Resp: TypeAlias = code_mode_service_pb2.ExecResponse | code_mode_service_pb2.WaitResponse


class Closed:
    """Marks the end of a queue."""


EOF = Closed()
"""What `LegStream.recv` returns once the server has closed the stream."""
_HALF_CLOSE = Closed()


class LegStream(Generic[_Req]):
    """One bidi call with a reader and a writer task (send/recv/close over queues)."""

    def __init__(self, call: grpc.aio.StreamStreamCall, request_cls: type[_Req]) -> None:
        self._call = call
        self._request_cls: type[_Req] = request_cls
        self._outbox: asyncio.Queue[tuple[_Req | Closed, asyncio.Future[None]]] = asyncio.Queue()
        self._inbox: asyncio.Queue[_Resp | Closed | BaseException] = asyncio.Queue()
        self._writer = asyncio.create_task(self._write_loop())
        self._reader = asyncio.create_task(self._read_loop())
        self.open = True
        """Whether the leg may still carry tool results (false after its Result)."""

    def send(self, **message: Any) -> asyncio.Future[None]:
        """Queues one request; the future settles once it is written (or fails)."""
        return self._enqueue(self._request_cls(**message))

    def half_close(self) -> asyncio.Future[None]:
        """Queues the end of the request stream."""
        return self._enqueue(_HALF_CLOSE)

    def _enqueue(self, item: _Req | Closed) -> asyncio.Future[None]:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._outbox.put_nowait((item, fut))
        return fut

    async def recv(self) -> _Resp | Closed:
        """Returns the next response or `EOF`; raises the mapped error of a failed call."""
        item = await self._inbox.get()
        if isinstance(item, BaseException):
            self._inbox.put_nowait(item)
            raise item
        if item is EOF:
            self._inbox.put_nowait(item)
        return item

    async def _write_loop(self) -> None:
        failure: BaseException | None = None
        while True:
            item, fut = await self._outbox.get()
            if failure is None:
                try:
                    if item is _HALF_CLOSE:
                        await self._call.done_writing()
                    else:
                        await self._call.write(item)
                except grpc.RpcError as exc:
                    failure = from_grpc_error(exc)
                except asyncio.InvalidStateError as exc:
                    failure = ProtocolError(f"stream closed: {exc}")
            if not fut.done():
                if failure is None:
                    fut.set_result(None)
                else:
                    fut.set_exception(failure)
                    fut.exception()  # mark retrieved; the sender decides whether it matters

    async def _read_loop(self) -> None:
        try:
            while True:
                msg = await self._call.read()
                if msg is grpc.aio.EOF:
                    self._inbox.put_nowait(EOF)
                    return
                self._inbox.put_nowait(msg)
        except grpc.RpcError as exc:
            err = from_grpc_error(exc)
            err.__cause__ = None
            self._inbox.put_nowait(err)
        except asyncio.CancelledError:
            self._inbox.put_nowait(ProtocolError("stream cancelled"))
            raise

    async def finish(self, timeout: float) -> None:
        """Half-closes, waits up to ``timeout`` seconds for the server to close, then cancels."""
        self.open = False
        self.half_close()
        with contextlib.suppress(TimeoutError, asyncio.CancelledError, Exception):
            await asyncio.wait_for(asyncio.shield(self._reader), timeout)
        self.cancel()
        # Let both tasks observe their cancellation before the stream is dropped.
        await asyncio.gather(self._writer, self._reader, return_exceptions=True)

    def cancel(self) -> None:
        """Cancels the call and both tasks."""
        self.open = False
        self._call.cancel()
        self._writer.cancel()
        self._reader.cancel()
