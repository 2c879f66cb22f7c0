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

Modules by role: this one (the client, its Exec/Wait and run RPCs), ``_catalog_calls`` (its
catalog RPCs), ``_legs`` (a leg and its nested tool calls), ``_stream`` (one bidi stream),
``_types`` and ``_results`` (the values), ``_errors`` (the exception tree).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from datetime import timedelta
from types import TracebackType
from typing import Any, Literal, Self

import grpc
import grpc.aio

from cellblock.client._catalog_calls import CatalogCalls
from cellblock.client._errors import UnavailableError
from cellblock.client._legs import MAX_MESSAGE_BYTES, LegDriver, OutputCallback, ToolHandler, to_arguments_json
from cellblock.client._results import LimitOverrides, Run, RunPage, RunResult
from cellblock.client._stream import LegStream
from cellblock.client._types import RunStateName, ScopeLike, ToolSurface, _scope
from cellblock.v1 import (
    catalog_service_pb2_grpc,
    code_mode_service_pb2,
    code_mode_service_pb2_grpc,
    run_service_pb2,
    run_service_pb2_grpc,
)

__all__ = ["CellblockClient"]


class CellblockClient(CatalogCalls):
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
        self._legs = LegDriver()
        self._closed = False

    @classmethod
    async def connect(
        cls,
        target: str,
        *,
        timeout: timedelta | float | None = timedelta(seconds=10),
        rpc_timeout: timedelta | None = timedelta(seconds=60),
        rpc_metadata: Mapping[str, str] | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        channel_options: Sequence[tuple[str, Any]] = (),
    ) -> CellblockClient:
        """Connects to a cellblock service and waits until the channel is ready.

        Args:
            target: gRPC target, e.g. ``"127.0.0.1:50051"`` or ``"unix:/run/cellblock.sock"``.
            timeout: How long to wait for the channel to become ready (a
                `timedelta` or seconds); default 10 seconds. ``None`` skips the wait.
            rpc_timeout: Deadline of each unary RPC; default 60 seconds, past the
                service's 30 s registration budget, so a refused registration's own
                answer arrives before the deadline.
                ``None`` means no deadline. Exec/Wait streams never get one.
            rpc_metadata: gRPC metadata (e.g. ``traceparent``) sent with every call.
            credentials: TLS channel credentials; ``None`` (default) for plaintext.
            channel_options: Extra grpc channel options as ``(key, value)`` pairs.

        Returns:
            The connected client.

        Raises:
            UnavailableError: If the channel is not ready within ``timeout``.
        """
        # The service's message cap in both directions (ToolCall inputs up to
        # the reply inbox come in; results go out), unless the caller says otherwise.
        options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES), ("grpc.max_send_message_length", MAX_MESSAGE_BYTES), *channel_options]
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
        await self._legs.close()
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
        arguments_json = to_arguments_json({"code": code} if code is not None else arguments)
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
        stream = LegStream(call, code_mode_service_pb2.ExecRequest)
        return await self._legs.run_leg(stream, start, None, handlers or {}, on_output)

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
            arguments_json = to_arguments_json(arguments)
        else:
            arguments_json = to_arguments_json({"runId": run_id})
        start = code_mode_service_pb2.WaitStart(
            scope=_scope(scope)._to_proto(), tool_call_id=tool_call_id, arguments_json=arguments_json
        )
        call = self._code_mode.Wait(metadata=self._metadata + tuple((metadata or {}).items()))
        stream = LegStream(call, code_mode_service_pb2.WaitRequest)
        return await self._legs.run_leg(stream, start, run_id or None, handlers or {}, on_output)

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
        self._legs.forget(run_id)
        states: dict[int, Literal["running", "suspended", "unspecified"]] = {
            run_service_pb2.RUN_STATE_RUNNING: "running",
            run_service_pb2.RUN_STATE_SUSPENDED: "suspended",
        }
        return states.get(response.previous_state, "unspecified")
