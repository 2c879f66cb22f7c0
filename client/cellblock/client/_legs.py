"""The client's leg driver: one ``Exec``/``Wait`` leg and the nested tool calls it serves.

A leg writes its start message, runs the matching handler of every ``ToolCall`` as its own
task, forwards output entries, and returns the leg's single ``Result``. Handler tasks belong to
their run (`RunCalls`), not to the leg: calls still running when a leg returns ``waiting`` keep
running, and their results go out on the run's next ``Wait`` stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeAlias

from cellblock.client._errors import ProtocolError, ToolRefused
from cellblock.client._results import OutputEntry, RunResult, ToolCallInfo
from cellblock.client._stream import Closed, LegStream
from cellblock.v1 import code_mode_service_pb2

__all__ = ["LegDriver", "OutputCallback", "RunCalls", "ToolHandler", "to_arguments_json"]

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


class RunCalls:
    """Handler tasks of one run, and their results not yet delivered to any leg."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.tasks: dict[str, asyncio.Task[code_mode_service_pb2.ToolResult]] = {}
        self.abandoned: set[str] = set()
        self.undelivered: list[code_mode_service_pb2.ToolResult] = []
        # The run's open legs, oldest first, each with the results written on it; results go
        # out on the first. Two are open when a second wait races the one serving the run: the
        # service refuses one of them ([W06]), and the refusal hands the run to the other.
        self.streams: dict[LegStream[Any], list[code_mode_service_pb2.ToolResult]] = {}

    @property
    def stream(self) -> LegStream[Any] | None:
        """The leg the run's results go out on: its oldest open one."""
        return next(iter(self.streams), None)

    @property
    def idle(self) -> bool:
        """True when no handler runs and no result waits for a leg."""
        return not self.tasks and not self.undelivered

    def abandon(self, nested_call_id: str) -> None:
        """Cancels one handler task; its result is dropped, not sent."""
        task = self.tasks.get(nested_call_id)
        if task is not None:
            self.abandoned.add(nested_call_id)
            task.cancel()

    def abandon_all(self) -> None:
        """Cancels every handler task of the run and drops undelivered results."""
        for nested_call_id in list(self.tasks):
            self.abandon(nested_call_id)
        self.undelivered.clear()
        for sent in self.streams.values():
            sent.clear()


def _refused_before_the_run(result: RunResult) -> bool:
    """Whether a wait's result is a refusal of the wait itself, not an end of its run.

    The service answers a wait it cannot serve (bad input, an unknown run, another
    session's or agent run's run, a run another wait is resuming) with an
    ``invalid_input`` result in the ``input`` phase, before any cell or bridge work
    (SPEC §5.2: such a refusal changes nothing); every end of a run itself is in a later phase.
    """
    return result.status == "failed" and result.code == "invalid_input" and result.failure_phase == "input"


class LegDriver:
    """Runs legs and keeps each run's handler tasks between them (one per client)."""

    def __init__(self) -> None:
        """Starts with no runs and no background tasks."""
        self.runs: dict[str, RunCalls] = {}
        self._background: set[asyncio.Task[Any]] = set()

    async def close(self) -> None:
        """Cancels every run's handlers and every background task, and waits for them."""
        for run in list(self.runs.values()):
            run.abandon_all()
        self.runs.clear()
        background = list(self._background)
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)

    def forget(self, run_id: str) -> None:
        """Cancels the handlers of a run that was cancelled; unknown runs are ignored."""
        run = self.runs.pop(run_id, None)
        if run is not None:
            run.abandon_all()

    async def run_leg(
        self,
        stream: LegStream[Any],
        start: Any,
        run_id: str | None,
        handlers: Mapping[str, ToolHandler],
        on_output: OutputCallback | None,
    ) -> RunResult:
        """Drives one leg to its Result, serving its tool calls; Cancel on any exception.

        Args:
            stream: The leg's open stream.
            start: The ``ExecStart`` or ``WaitStart`` message.
            run_id: The waited run's id (``None`` for an exec).
            handlers: Tool handlers by catalog id or name.
            on_output: Called with each output entry.

        Returns:
            The leg's result.

        Raises:
            ProtocolError: The stream ended without a Result.
        """
        run: RunCalls | None = None
        try:
            # A failed start write surfaces as the call's status on the read side.
            stream.send(start=start)
            if run_id is not None:
                # A wait: resume delivering the run's results on this stream.
                run = self._attach(run_id, stream)
            while True:
                msg = await stream.recv()
                if isinstance(msg, Closed):
                    raise ProtocolError("the service closed the stream without a Result")
                kind = msg.WhichOneof("message")
                if kind == "tool_call":
                    tc = msg.tool_call
                    if run is None or run.run_id != tc.run_id:
                        run = self._attach(tc.run_id, stream)
                    self._dispatch(run, tc, handlers)
                elif kind == "output":
                    await _forward_output(msg.output.entry_json, on_output)
                elif kind == "tool_call_cancelled":
                    self._abandon(run, msg.tool_call_cancelled.nested_call_id)
                elif kind == "result":
                    result = RunResult._from_proto(msg.result)
                    self._end_leg(stream, run, result, refused_wait=run_id is not None and _refused_before_the_run(result))
                    return result
        except BaseException:
            self._abort_leg(stream, run)
            raise

    def _abandon(self, run: RunCalls | None, nested_call_id: str) -> None:
        """Cancels the handler of a nested call the service cancelled (this leg's run first)."""
        for candidate in ([run] if run is not None else []) + list(self.runs.values()):
            if nested_call_id in candidate.tasks:
                candidate.abandon(nested_call_id)
                return

    def _attach(self, run_id: str, stream: LegStream[Any]) -> RunCalls:
        run = self.runs.get(run_id)
        if run is None:
            run = self.runs[run_id] = RunCalls(run_id)
        if stream not in run.streams:
            run.streams[stream] = []
            if len(run.streams) == 1:
                self._flush(run)
        return run

    def _detach(self, run: RunCalls, stream: LegStream[Any], *, resend: bool) -> int:
        """Removes an ended leg from its run; returns how many legs of the run are still open.

        Args:
            run: The leg's run.
            stream: The leg's stream.
            resend: Keep what the leg carried for the run's next leg (it may have missed the
                run); it goes out at once on the run's next open leg, if any.
        """
        sent = run.streams.pop(stream, None)
        if sent is not None and resend:
            run.undelivered[:0] = sent
        if sent is not None and run.streams:
            self._flush(run)
        return len(run.streams)

    def _flush(self, run: RunCalls) -> None:
        backlog, run.undelivered = run.undelivered, []
        for result in backlog:
            self._deliver(run, result)

    def _end_leg(self, stream: LegStream[Any], run: RunCalls | None, result: RunResult, *, refused_wait: bool = False) -> None:
        """Ends a leg on its Result: keeps, or cancels and drops, its run's handlers.

        Args:
            stream: The leg's stream.
            run: The leg's run, if one was attached.
            result: The leg's result.
            refused_wait: The leg was a wait the service refused before it touched
                the run (its input, or the run's owner or lease: [W01]-[W08]): the
                run still waits, so its handlers keep running and every result this
                stream carried goes out again on the next wait.
        """
        stream.open = False
        self._spawn(stream.finish(_DRAIN_TIMEOUT_S))
        if run is None:
            run = self.runs.get(result.run_id or "")
        if run is None:
            return
        if result.status == "waiting" or refused_wait:
            # Results written just before the service suspended may have missed the leg, and
            # a refused wait's stream was never read into the run: resend them on the next wait
            # (repeats are ignored).
            resend = refused_wait or any(p.method in _NESTED_CALL_METHODS for p in result.pending_tool_calls)
            if self._detach(run, stream, resend=resend) == 0 and run.idle:
                # Nothing to keep (e.g. a second wait on a finished run, [W03]).
                self.runs.pop(run.run_id, None)
        else:
            run.abandon_all()
            self.runs.pop(run.run_id, None)

    def _abort_leg(self, stream: LegStream[Any], run: RunCalls | None) -> None:
        """Sends Cancel (the run is aborted), stops the run's handlers, drains in the background."""
        if not stream.open:
            return
        stream.open = False
        cancelled = stream.send(cancel=code_mode_service_pb2.Cancel(reason="client cancelled the leg"))
        # A leg that failed while another leg of its run is open (a second wait refused with a
        # status) leaves the run to that leg; else the run ends here.
        if run is not None and self._detach(run, stream, resend=True) == 0:
            run.abandon_all()
            self.runs.pop(run.run_id, None)

        async def drain() -> None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(cancelled), _CANCEL_WRITE_TIMEOUT_S)
            await stream.finish(_DRAIN_TIMEOUT_S)

        self._spawn(drain())

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _dispatch(
        self, run: RunCalls, tc: code_mode_service_pb2.ToolCall, handlers: Mapping[str, ToolHandler]
    ) -> None:
        if tc.nested_call_id in run.tasks:
            return
        info = ToolCallInfo._from_proto(tc)
        handler = handlers.get(tc.catalog_id) or handlers.get(tc.name)

        async def serve() -> code_mode_service_pb2.ToolResult:
            result = await _invoke(handler, tc.input_json, info)
            # Handed to the stream's writer by the handler's own task as it ends (nothing
            # can cancel it between the two): no loop turn for a done callback per result.
            run.tasks.pop(tc.nested_call_id, None)
            self._deliver(run, result)
            return result

        task = asyncio.create_task(serve(), name=f"cellblock-tool:{tc.nested_call_id}")
        run.tasks[tc.nested_call_id] = task

        def done(t: asyncio.Task[code_mode_service_pb2.ToolResult]) -> None:
            if not t.cancelled():
                return  # delivered by serve()
            run.tasks.pop(tc.nested_call_id, None)
            if tc.nested_call_id in run.abandoned:
                run.abandoned.discard(tc.nested_call_id)
                return
            self._deliver(run, _error_result(tc.nested_call_id, "cancelled", "the tool handler was cancelled"))

        task.add_done_callback(done)

    def _deliver(self, run: RunCalls, result: code_mode_service_pb2.ToolResult) -> None:
        """Queues ``result`` on the run's open stream now, or keeps it for the run's next leg.

        No task per result: the handler's task hands it straight to the stream's writer (a
        cancelled handler's done callback hands over its ``cancelled`` result). It is kept for
        the next leg when no stream is open, the write fails (a ``CellblockError``), or the leg
        ended while it was written.
        """
        stream = run.stream
        if stream is None or not stream.open:
            self._keep(run, result)
            return

        def written(fut: asyncio.Future[None]) -> None:
            sent = run.streams.get(stream)
            if not fut.cancelled() and fut.exception() is None and sent is not None:
                sent.append(result)
            else:
                # The write failed (a CellblockError), or the leg ended while it was written.
                self._keep(run, result)

        stream.send(tool_result=result).add_done_callback(written)

    def _keep(self, run: RunCalls, result: code_mode_service_pb2.ToolResult) -> None:
        if self.runs.get(run.run_id) is run:
            run.undelivered.append(result)


async def _forward_output(entry_json: str, on_output: OutputCallback | None) -> None:
    """Hands one output entry to the caller's callback, awaiting it when it is async."""
    if on_output is not None:
        maybe = on_output(OutputEntry.from_json(json.loads(entry_json)))
        if inspect.isawaitable(maybe):
            await maybe


#: The service's gRPC message cap in bytes (SPEC §2.3, §3.5 item 5); a larger ToolResult
#: is sent as ``oversized_bytes``.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
#: Room kept for the ToolResult's own fields (nested call id, framing).
_TOOL_RESULT_ENVELOPE_BYTES = 4096


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
    except RecursionError:
        return _error_result(info.nested_call_id, "failed", "the tool result is nested too deeply to serialise as JSON")
    size = len(ok_json.encode("utf-8", "surrogatepass"))
    if size + _TOOL_RESULT_ENVELOPE_BYTES > MAX_MESSAGE_BYTES:
        # gRPC would end the whole stream for an oversized message; the
        # service answers the guest with B12 instead (SPEC §3.5 item 5).
        return code_mode_service_pb2.ToolResult(nested_call_id=info.nested_call_id, oversized_bytes=size)
    return code_mode_service_pb2.ToolResult(nested_call_id=info.nested_call_id, ok_json=ok_json)


def _error_result(nested_call_id: str, kind: str, message: str) -> code_mode_service_pb2.ToolResult:
    return code_mode_service_pb2.ToolResult(
        nested_call_id=nested_call_id,
        error=code_mode_service_pb2.ToolError(kind=_KIND_TO_PROTO[kind], message=message),
    )


def to_arguments_json(arguments: Mapping[str, Any] | str | None) -> str:
    """The exec/wait arguments as JSON text: a string is forwarded verbatim."""
    if isinstance(arguments, str):
        return arguments
    try:
        return _json_text(dict(arguments or {}))
    except RecursionError:
        raise ValueError("the arguments nest too deeply to encode as JSON (the service reads at most 256 levels)") from None


#: ``json.dumps``'s encoders for :func:`_json_text`, built once (``dumps`` builds one per call given options).
_COMPACT = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))
_COMPACT_ASCII = json.JSONEncoder(ensure_ascii=True, allow_nan=False, separators=(",", ":"))


def _json_text(value: Any) -> str:
    r"""Compact JSON for a proto string field: UTF-8 text, lone surrogates as ``\uXXXX``.

    Raises:
        ValueError: NaN or infinities (not JSON).
        TypeError: A value that is not JSON-serialisable.
        RecursionError: A value nested deeper than Python's JSON encoder goes (about 1000 levels).
    """
    text = _COMPACT.encode(value)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        # Protobuf strings must be valid UTF-8; escaping everything keeps lone surrogates as escapes.
        text = _COMPACT_ASCII.encode(value)
    return text
