"""The async cellblock client: catalogs, the tool surface, exec/wait legs and runs.

A leg is one bidirectional ``Exec`` or ``Wait`` stream. The client writes the
start message, then serves every ``ToolCall`` by running the matching handler
as its own task, and returns the leg's single ``Result`` as a `RunResult`::

    async with await CellblockClient.connect("unix:/run/cellblock.sock") as client:
        scope = Scope("session-1", "agent-run-1")
        await client.put_catalog(scope, tools)
        result = await client.exec(
            scope, tool_call_id="call_1", code="return 1 + 1", handlers=handlers
        )
        while result.status == "waiting":
            result = await client.wait(
                scope, tool_call_id="call_2", run_id=result.run_id, handlers=handlers
            )
        reply_to_model(result.raw_json)

No task of the caller ever awaits grpc directly: each stream has a reader and
a writer task, so cancelling the caller (or a handler) never tears down the
transport before the ``Cancel`` message is sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import timedelta
from types import TracebackType
from typing import Any, Generic, Literal, Self, TypeAlias, TypeVar

import grpc
import grpc.aio

from cellblock.client._errors import (
    CellblockError,
    ProtocolError,
    ToolRefused,
    UnavailableError,
    from_grpc_error,
)
from cellblock.client._types import (
    Catalog,
    CatalogPage,
    CatalogSummary,
    CatalogTelemetry,
    DeleteCatalogResult,
    LimitOverrides,
    OutputEntry,
    Run,
    RunPage,
    RunResult,
    RunStateName,
    Scope,
    ScopeLike,
    Tool,
    ToolCallInfo,
    ToolSurface,
    _scope,
    _tools_to_proto,
)
from cellblock.v1 import (
    catalog_service_pb2,
    catalog_service_pb2_grpc,
    code_mode_service_pb2,
    code_mode_service_pb2_grpc,
    run_service_pb2,
    run_service_pb2_grpc,
)

__all__ = ["CellblockClient", "OutputCallback", "ToolHandler"]

_log = logging.getLogger(__name__)

ToolHandler: TypeAlias = Callable[[dict[str, Any], ToolCallInfo], Awaitable[Any]]
"""``async def handler(input: dict, call: ToolCallInfo) -> Any``; the return value is sent as JSON."""

OutputCallback: TypeAlias = Callable[[OutputEntry], Awaitable[None] | None]
"""Called with each output entry as the service accepts it; may be sync or async."""

_KIND_TO_PROTO = {
    "invalid_input": code_mode_service_pb2.TOOL_ERROR_KIND_INVALID_INPUT,
    "blocked": code_mode_service_pb2.TOOL_ERROR_KIND_BLOCKED,
    "failed": code_mode_service_pb2.TOOL_ERROR_KIND_FAILED,
    "cancelled": code_mode_service_pb2.TOOL_ERROR_KIND_CANCELLED,
}
_NESTED_CALL_METHODS = frozenset({"call", "callValue", "namespace"})
_CANCEL_WRITE_TIMEOUT_S = 1.0
_DRAIN_TIMEOUT_S = 5.0

_Req = TypeVar("_Req", code_mode_service_pb2.ExecRequest, code_mode_service_pb2.WaitRequest)
_Resp: TypeAlias = code_mode_service_pb2.ExecResponse | code_mode_service_pb2.WaitResponse


# ---------------------------------------------------------------------------
# Stream plumbing


class _Closed:
    """Marks the end of a queue."""


_EOF = _Closed()
_HALF_CLOSE = _Closed()


class _Stream(Generic[_Req]):
    """One bidi call with a reader and a writer task (send/recv/close over queues)."""

    def __init__(self, call: grpc.aio.StreamStreamCall, request_cls: type[_Req]) -> None:
        self._call = call
        self._request_cls: type[_Req] = request_cls
        self._outbox: asyncio.Queue[tuple[_Req | _Closed, asyncio.Future[None]]] = asyncio.Queue()
        self._inbox: asyncio.Queue[_Resp | _Closed | BaseException] = asyncio.Queue()
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

    def _enqueue(self, item: _Req | _Closed) -> asyncio.Future[None]:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._outbox.put_nowait((item, fut))
        return fut

    async def recv(self) -> _Resp | _Closed:
        """Returns the next response or `_EOF`; raises the mapped error of a failed call."""
        item = await self._inbox.get()
        if isinstance(item, BaseException):
            self._inbox.put_nowait(item)
            raise item
        if item is _EOF:
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
                    self._inbox.put_nowait(_EOF)
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


# ---------------------------------------------------------------------------
# Nested-call bookkeeping per run


class _RunCalls:
    """Handler tasks of one run, and their results not yet delivered to any leg."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.tasks: dict[str, asyncio.Task[code_mode_service_pb2.ToolResult]] = {}
        self.abandoned: set[str] = set()
        self.undelivered: list[code_mode_service_pb2.ToolResult] = []
        self.stream: _Stream[Any] | None = None
        self.sent_on_stream: list[code_mode_service_pb2.ToolResult] = []

    @property
    def idle(self) -> bool:
        return not self.tasks and not self.undelivered

    def abandon(self, nested_call_id: str) -> None:
        task = self.tasks.get(nested_call_id)
        if task is not None:
            self.abandoned.add(nested_call_id)
            task.cancel()

    def abandon_all(self) -> None:
        for nested_call_id in list(self.tasks):
            self.abandon(nested_call_id)
        self.undelivered.clear()


# ---------------------------------------------------------------------------
# The client


class CellblockClient:
    """Async client of the cellblock gRPC services.

    Create it with `CellblockClient.connect`; use it as an async context
    manager or call `close`. All methods are coroutines and every option is
    keyword-only. gRPC failures raise `RPCError` subclasses; run failures are
    `RunResult` values with ``status == "failed"``.
    """

    def __init__(
        self,
        channel: grpc.aio.Channel,
        *,
        target: str,
        rpc_timeout: timedelta | None,
        rpc_metadata: Mapping[str, str],
    ) -> None:
        """Wraps an open channel; prefer `CellblockClient.connect`.

        Args:
            channel: An open grpc.aio channel to cellblock.
            target: The target the channel was opened for, for messages.
            rpc_timeout: Deadline of each unary RPC, or ``None`` for none.
            rpc_metadata: gRPC metadata sent with every call.
        """
        self._channel = channel
        self._target = target
        self._rpc_timeout = rpc_timeout.total_seconds() if rpc_timeout is not None else None
        self._metadata = tuple(rpc_metadata.items())
        self._catalogs = catalog_service_pb2_grpc.CatalogServiceStub(channel)
        self._code_mode = code_mode_service_pb2_grpc.CodeModeServiceStub(channel)
        self._runs_stub = run_service_pb2_grpc.RunServiceStub(channel)
        self._runs: dict[str, _RunCalls] = {}
        self._background: set[asyncio.Task[Any]] = set()
        self._closed = False

    @classmethod
    async def connect(
        cls,
        target: str,
        *,
        timeout: timedelta | float | None = timedelta(seconds=10),
        rpc_timeout: timedelta | None = timedelta(seconds=30),
        rpc_metadata: Mapping[str, str] | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        channel_options: Sequence[tuple[str, Any]] = (),
    ) -> CellblockClient:
        """Connects to a cellblock service and waits until the channel is ready.

        Args:
            target: gRPC target, e.g. ``"127.0.0.1:50051"`` or ``"unix:/run/cellblock.sock"``.
            timeout: How long to wait for the channel to become ready (a
                `timedelta` or seconds); default 10 seconds. ``None`` skips the wait.
            rpc_timeout: Deadline of each unary RPC; default 30 seconds.
                ``None`` means no deadline. Exec/Wait streams never get one.
            rpc_metadata: gRPC metadata (e.g. ``traceparent``) sent with every call.
            credentials: TLS channel credentials; ``None`` (default) for plaintext.
            channel_options: Extra grpc channel options as ``(key, value)`` pairs.

        Returns:
            The connected client.

        Raises:
            UnavailableError: If the channel is not ready within ``timeout``.
        """
        options = list(channel_options)
        if credentials is None:
            channel = grpc.aio.insecure_channel(target, options=options)
        else:
            channel = grpc.aio.secure_channel(target, credentials, options=options)
        if timeout is not None:
            seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
            try:
                await asyncio.wait_for(channel.channel_ready(), seconds)
            except TimeoutError:
                await channel.close()
                raise UnavailableError(
                    grpc.StatusCode.UNAVAILABLE,
                    f"cellblock at {target} was not reachable within {seconds:g} s",
                ) from None
            except BaseException:
                await channel.close()
                raise
        return cls(channel, target=target, rpc_timeout=rpc_timeout, rpc_metadata=rpc_metadata or {})

    async def close(self) -> None:
        """Cancels outstanding handler tasks and closes the channel. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for run in list(self._runs.values()):
            run.abandon_all()
        self._runs.clear()
        background = list(self._background)
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        await self._channel.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # -- unary plumbing -----------------------------------------------------

    async def _unary(self, method: Any, request: Any) -> Any:
        try:
            return await method(request, timeout=self._rpc_timeout, metadata=self._metadata)
        except grpc.RpcError as exc:
            raise from_grpc_error(exc) from None

    # -- CatalogService -----------------------------------------------------

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

    # -- CodeModeService ----------------------------------------------------

    async def tool_surface(self, scope: ScopeLike, model_id: str = "") -> ToolSurface:
        """Returns the model-visible tools of a scope for one model (SPEC §3.3).

        Args:
            scope: The owning scope.
            model_id: The model id, e.g. ``"anthropic/claude-opus-5"``; empty means unknown.

        Returns:
            ``exec``/``wait`` plus direct tools when code mode is engaged, else the
            registered tools unchanged.
        """
        request = code_mode_service_pb2.GetToolSurfaceRequest(scope=_scope(scope)._to_proto(), model_id=model_id)
        response = await self._unary(self._code_mode.GetToolSurface, request)
        return ToolSurface._from_proto(response)

    async def exec(
        self,
        scope: ScopeLike,
        *,
        tool_call_id: str,
        arguments: Mapping[str, Any] | str | None = None,
        code: str | None = None,
        handlers: Mapping[str, ToolHandler] | None = None,
        on_output: OutputCallback | None = None,
        turn_id: str | None = None,
        force_restart_safe: bool = False,
        limits: LimitOverrides | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> RunResult:
        """Runs one ``exec`` leg and serves its nested tool calls.

        Each ``ToolCall`` runs ``handlers[catalog_id]`` (else ``handlers[name]``)
        as its own task; the return value is sent as JSON. A handler raising
        `ToolRefused` sends that kind and message; any other exception sends
        kind ``"failed"`` with its message; a missing handler sends ``"failed"``
        ``"no handler registered for <id>"``. Calls still running when the leg
        returns ``waiting`` keep running; their results go out on the next
        `wait` of the run.

        Args:
            scope: The owning scope.
            tool_call_id: The model's tool-call id for this exec call; non-empty.
            arguments: The model's exec arguments, as a dict or JSON text
                (forwarded verbatim). Exclusive with ``code``.
            code: Convenience: builds ``{"code": code}`` as the arguments.
            handlers: Async tool handlers keyed by catalog id or tool name.
            on_output: Called with each output entry as it is produced.
            turn_id: Optional turn id; part of the replay id.
            force_restart_safe: Run as restart-safe whatever the model said.
            limits: Optional per-exec limit overrides.
            metadata: gRPC metadata for this call only (e.g. this turn's
                ``traceparent``), after the connection's ``rpc_metadata``.

        Returns:
            The leg's result; ``status`` is ``completed``, ``waiting`` or ``failed``.

        Raises:
            ValueError: If neither or both of ``arguments`` and ``code`` are given.
            FailedPreconditionError: If the scope has no catalog.
            ResourceExhaustedError: If admission control refused the leg.
            ProtocolError: If the stream ended without a Result.
        """
        if (arguments is None) == (code is None):
            raise ValueError("pass exactly one of arguments= and code=")
        arguments_json = _arguments_json({"code": code} if code is not None else arguments)
        start = code_mode_service_pb2.ExecStart(
            scope=_scope(scope)._to_proto(),
            tool_call_id=tool_call_id,
            arguments_json=arguments_json,
            turn_id=turn_id or "",
            force_restart_safe=force_restart_safe,
        )
        if limits is not None:
            start.limit_overrides.CopyFrom(limits._to_proto())
        call = self._code_mode.Exec(metadata=self._metadata + tuple((metadata or {}).items()))
        stream = _Stream(call, code_mode_service_pb2.ExecRequest)
        return await self._run_leg(stream, start, None, handlers or {}, on_output)

    async def wait(
        self,
        scope: ScopeLike,
        *,
        tool_call_id: str,
        run_id: str | None = None,
        arguments: Mapping[str, Any] | str | None = None,
        handlers: Mapping[str, ToolHandler] | None = None,
        on_output: OutputCallback | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> RunResult:
        """Runs one ``wait`` leg on a run that returned ``waiting``.

        Results of nested calls dispatched in earlier legs are sent on this
        stream as their handlers finish (results that finished in between are
        sent right after the start message).

        Args:
            scope: The scope that started the run.
            tool_call_id: The model's tool-call id for this wait call; non-empty.
            run_id: The ``run_id`` of the waiting result; builds ``{"runId": run_id}``.
            arguments: The model's wait arguments as a dict or JSON text,
                forwarded verbatim. Exclusive with ``run_id``.
            handlers: Async tool handlers for calls made in this leg.
            on_output: Called with each output entry as it is produced.
            metadata: gRPC metadata for this call only (e.g. this turn's
                ``traceparent``), after the connection's ``rpc_metadata``.

        Returns:
            The leg's result.

        Raises:
            ValueError: If neither or both of ``run_id`` and ``arguments`` are given.
            FailedPreconditionError: If the scope has no catalog.
            ResourceExhaustedError: If admission control refused the leg.
        """
        if (run_id is None) == (arguments is None):
            raise ValueError("pass exactly one of run_id= and arguments=")
        if run_id is None:
            parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
            run_id = str(parsed.get("runId", "")) if isinstance(parsed, Mapping) else ""
            arguments_json = _arguments_json(arguments)
        else:
            arguments_json = _arguments_json({"runId": run_id})
        start = code_mode_service_pb2.WaitStart(
            scope=_scope(scope)._to_proto(), tool_call_id=tool_call_id, arguments_json=arguments_json
        )
        call = self._code_mode.Wait(metadata=self._metadata + tuple((metadata or {}).items()))
        stream = _Stream(call, code_mode_service_pb2.WaitRequest)
        return await self._run_leg(stream, start, run_id or None, handlers or {}, on_output)

    # -- RunService ---------------------------------------------------------

    async def get_run(self, scope: ScopeLike, run_id: str) -> Run:
        """Returns one run of the scope.

        Args:
            scope: The caller's scope.
            run_id: The run id.

        Returns:
            The run.

        Raises:
            NotFoundError: If the run is unknown, expired or another scope's.
        """
        request = run_service_pb2.GetRunRequest(scope=_scope(scope)._to_proto(), run_id=run_id)
        response = await self._unary(self._runs_stub.GetRun, request)
        return Run._from_proto(response.run)

    async def list_runs(self, scope: ScopeLike, *, page_size: int = 0, page_token: str = "") -> RunPage:
        """Lists one page of the scope's running and suspended runs, oldest first.

        Args:
            scope: The caller's scope.
            page_size: Maximum runs per page, 1..1000; 0 (default) means 100.
            page_token: ``next_page_token`` of the previous page; empty for the first.

        Returns:
            The page.
        """
        request = run_service_pb2.ListRunsRequest(
            scope=_scope(scope)._to_proto(), page_size=page_size, page_token=page_token
        )
        response = await self._unary(self._runs_stub.ListRuns, request)
        return RunPage(runs=[Run._from_proto(r) for r in response.runs], next_page_token=response.next_page_token)

    async def cancel_run(self, scope: ScopeLike, run_id: str) -> RunStateName:
        """Aborts an active leg or discards a suspended run. Idempotent.

        Handler tasks this client still runs for the run are cancelled.

        Args:
            scope: The caller's scope.
            run_id: The run to cancel.

        Returns:
            The state the run was in: ``"running"`` or ``"suspended"``.

        Raises:
            NotFoundError: If the run is unknown or another scope's.
        """
        request = run_service_pb2.CancelRunRequest(scope=_scope(scope)._to_proto(), run_id=run_id)
        response = await self._unary(self._runs_stub.CancelRun, request)
        run = self._runs.pop(run_id, None)
        if run is not None:
            run.abandon_all()
        states: dict[int, Literal["running", "suspended", "unspecified"]] = {
            run_service_pb2.RUN_STATE_RUNNING: "running",
            run_service_pb2.RUN_STATE_SUSPENDED: "suspended",
        }
        return states.get(response.previous_state, "unspecified")

    # -- legs ---------------------------------------------------------------

    async def _run_leg(
        self,
        stream: _Stream[Any],
        start: Any,
        run_id: str | None,
        handlers: Mapping[str, ToolHandler],
        on_output: OutputCallback | None,
    ) -> RunResult:
        run: _RunCalls | None = None
        try:
            # A failed start write surfaces as the call's status on the read side.
            stream.send(start=start)
            if run_id is not None:
                # A wait: resume delivering the run's results on this stream.
                run = self._attach(run_id, stream)
            while True:
                msg = await stream.recv()
                if isinstance(msg, _Closed):
                    raise ProtocolError("the service closed the stream without a Result")
                kind = msg.WhichOneof("message")
                if kind == "tool_call":
                    tc = msg.tool_call
                    if run is None or run.run_id != tc.run_id:
                        run = self._attach(tc.run_id, stream)
                    self._dispatch(run, tc, handlers)
                elif kind == "output":
                    if on_output is not None:
                        entry = OutputEntry.from_json(json.loads(msg.output.entry_json))
                        maybe = on_output(entry)
                        if inspect.isawaitable(maybe):
                            await maybe
                elif kind == "tool_call_cancelled":
                    nested_id = msg.tool_call_cancelled.nested_call_id
                    for candidate in ([run] if run is not None else []) + list(self._runs.values()):
                        if nested_id in candidate.tasks:
                            candidate.abandon(nested_id)
                            break
                elif kind == "result":
                    result = RunResult._from_proto(msg.result)
                    self._end_leg(stream, run, result)
                    return result
        except BaseException:
            self._abort_leg(stream, run)
            raise

    def _attach(self, run_id: str, stream: _Stream[Any]) -> _RunCalls:
        run = self._runs.get(run_id)
        if run is None:
            run = self._runs[run_id] = _RunCalls(run_id)
        if run.stream is not None and run.stream.open and run.stream is not stream:
            # Another leg of this run is still open (the service will refuse one of them).
            return run
        run.stream = stream
        run.sent_on_stream = []
        backlog, run.undelivered = run.undelivered, []
        for result in backlog:
            self._spawn(self._deliver(run, result))
        return run

    def _end_leg(self, stream: _Stream[Any], run: _RunCalls | None, result: RunResult) -> None:
        stream.open = False
        self._spawn(stream.finish(_DRAIN_TIMEOUT_S))
        if run is None:
            run = self._runs.get(result.run_id or "")
        if run is None:
            return
        if run.stream is stream:
            run.stream = None
        if result.status == "waiting":
            # Results written just before the service suspended may have missed
            # the leg; resend them on the next wait (repeats are ignored).
            if any(p.method in _NESTED_CALL_METHODS for p in result.pending_tool_calls):
                run.undelivered[:0] = run.sent_on_stream
            run.sent_on_stream = []
            if run.idle:
                self._runs.pop(run.run_id, None)
        else:
            run.abandon_all()
            self._runs.pop(run.run_id, None)

    def _abort_leg(self, stream: _Stream[Any], run: _RunCalls | None) -> None:
        """Sends Cancel (the run is aborted), stops the run's handlers, drains in the background."""
        if not stream.open:
            return
        stream.open = False
        cancelled = stream.send(cancel=code_mode_service_pb2.Cancel(reason="client cancelled the leg"))
        if run is not None:
            run.abandon_all()
            self._runs.pop(run.run_id, None)
            if run.stream is stream:
                run.stream = None

        async def drain() -> None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(cancelled), _CANCEL_WRITE_TIMEOUT_S)
            await stream.finish(_DRAIN_TIMEOUT_S)

        self._spawn(drain())

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # -- nested calls -------------------------------------------------------

    def _dispatch(
        self, run: _RunCalls, tc: code_mode_service_pb2.ToolCall, handlers: Mapping[str, ToolHandler]
    ) -> None:
        if tc.nested_call_id in run.tasks:
            return
        info = ToolCallInfo._from_proto(tc)
        handler = handlers.get(tc.catalog_id) or handlers.get(tc.name)
        task = asyncio.create_task(_invoke(handler, tc.input_json, info), name=f"cellblock-tool:{tc.nested_call_id}")
        run.tasks[tc.nested_call_id] = task

        def done(t: asyncio.Task[code_mode_service_pb2.ToolResult]) -> None:
            run.tasks.pop(tc.nested_call_id, None)
            if t.cancelled():
                if tc.nested_call_id in run.abandoned:
                    run.abandoned.discard(tc.nested_call_id)
                    return
                result = _error_result(tc.nested_call_id, "cancelled", "the tool handler was cancelled")
            else:
                result = t.result()
            self._spawn(self._deliver(run, result))

        task.add_done_callback(done)

    async def _deliver(self, run: _RunCalls, result: code_mode_service_pb2.ToolResult) -> None:
        stream = run.stream
        if stream is not None and stream.open:
            try:
                await asyncio.shield(stream.send(tool_result=result))
                if run.stream is stream:
                    run.sent_on_stream.append(result)
                    return
                # The leg ended while writing: keep it for the next one too.
            except CellblockError:
                pass
        if self._runs.get(run.run_id) is run:
            run.undelivered.append(result)


async def _invoke(handler: ToolHandler | None, input_json: str, info: ToolCallInfo) -> code_mode_service_pb2.ToolResult:
    """Runs one handler and turns its outcome into a ToolResult (never raises, except cancellation)."""
    if handler is None:
        return _error_result(info.nested_call_id, "failed", f"no handler registered for {info.catalog_id}")
    try:
        value = json.loads(input_json) if input_json else {}
        outcome = handler(value, info)
        if inspect.isawaitable(outcome):
            outcome = await outcome
    except ToolRefused as refusal:
        return _error_result(info.nested_call_id, refusal.kind, refusal.message)
    except Exception as exc:  # noqa: BLE001 - any handler failure becomes a `failed` ToolResult
        _log.warning("tool handler for %s failed", info.catalog_id, exc_info=True)
        return _error_result(info.nested_call_id, "failed", str(exc) or type(exc).__name__)
    try:
        ok_json = _json_text(outcome)
    except (TypeError, ValueError) as exc:
        return _error_result(info.nested_call_id, "failed", f"the tool result is not JSON-serialisable: {exc}")
    return code_mode_service_pb2.ToolResult(nested_call_id=info.nested_call_id, ok_json=ok_json)


def _error_result(nested_call_id: str, kind: str, message: str) -> code_mode_service_pb2.ToolResult:
    return code_mode_service_pb2.ToolResult(
        nested_call_id=nested_call_id,
        error=code_mode_service_pb2.ToolError(kind=_KIND_TO_PROTO[kind], message=message),
    )


def _arguments_json(arguments: Mapping[str, Any] | str | None) -> str:
    if isinstance(arguments, str):
        return arguments
    return _json_text(dict(arguments or {}))


def _json_text(value: Any) -> str:
    r"""Compact JSON for a proto string field: UTF-8 text, lone surrogates as ``\uXXXX``.

    Raises:
        ValueError: NaN or infinities (not JSON).
        TypeError: A value that is not JSON-serialisable.
    """
    text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        # Protobuf strings must be valid UTF-8; escaping everything keeps lone surrogates as escapes.
        text = json.dumps(value, ensure_ascii=True, allow_nan=False, separators=(",", ":"))
    return text
