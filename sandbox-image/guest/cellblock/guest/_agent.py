"""The guest agent: the process inside a cell that runs one leg.

It connects to the cell's own bridge socket, authenticates with the one-time
cell token, receives the program (or a snapshot), runs it in a
:class:`~cellblock.guest._vm.CellVM` and relays the guest's bridge requests
and output to the host until the leg ends. It holds no secrets and no catalog
state beyond what the host sent for this leg.

Exit codes are the bridge proto's ``CellExitCode``: 0 after a clean ``end``;
3 when the bridge cannot be reached; 124 when the agent's own watchdog stopped a
VM stuck past the deadline; 125 when the host went silent; 1, before it
connects, when the image's precompiled QuickJS module cannot be used
(:class:`~cellblock.guest._engine_load.EngineUnusableError`, fail closed).
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import sys
import threading
import time
from typing import Any

import grpc

from cellblock.bridge.v1 import bridge_service_pb2 as pb
from cellblock.bridge.v1 import bridge_service_pb2_grpc as pb_grpc
from cellblock.guest._engine_load import EngineUnusableError, preload_engine
from cellblock.guest._vm import CellVM, ControllerFaultError, Outbox, VMPoisonedError, engine_build_id

SOCKET_ENV = "CELLBLOCK_BRIDGE_SOCKET"
#: ``host:port`` of the replica's bridge port (Kubernetes); when set, the agent
#: dials it over TCP instead of the unix socket.
ADDRESS_ENV = "CELLBLOCK_BRIDGE_ADDRESS"
TOKEN_ENV = "CELLBLOCK_CELL_TOKEN"
#: PEM files for mutual TLS on the TCP bridge (all three, or none), and the
#: name the replica's certificate carries (pod IPs change; the name does not).
TLS_ENV = ("CELLBLOCK_BRIDGE_TLS_CA", "CELLBLOCK_BRIDGE_TLS_CERT", "CELLBLOCK_BRIDGE_TLS_KEY")
TLS_NAME_ENV = "CELLBLOCK_BRIDGE_TLS_NAME"
#: The engine heap limit the cell was sized for (bytes). With it the agent
#: prepares the leg's VM before it authenticates (engine instance and the
#: evaluated controller factory), so a pooled cell's leg does only per-leg work.
MEMORY_LIMIT_ENV = "CELLBLOCK_MEMORY_LIMIT_BYTES"
# The agent's watchdog ends the process when one VM step runs this long past
# the leg's deadline (an engine built-in that ignores the interrupt handler).
WATCHDOG_GRACE_S = 0.75
#: A cell whose host sends nothing for this long after the deadline exits
#: (its host died or lost it); the host's own watchdog acts far earlier.
HOST_SILENCE_GRACE_S = 30.0
#: How the engine reports a refused allocation (an uncaught one ends as R09).
_ENGINE_OOM = "InternalError: out of memory"
#: The guest error of a leg whose controller call threw (SPEC §8.1 item 5).
CONTROLLER_FAULT = "Error: the program changed a built-in the cell runtime relies on, and the runtime could not continue ({})."
#: Exit code when the precompiled QuickJS module cannot be used (Python's own
#: failure code: the bridge proto's CellExitCode has no value for it yet).
ENGINE_UNUSABLE_EXIT = 1
_REFUSALS = {"": pb.GUEST_REFUSAL_UNSPECIFIED, "pending_cap": pb.GUEST_REFUSAL_PENDING_CAP, "too_large": pb.GUEST_REFUSAL_TOO_LARGE, "namespace_arguments": pb.GUEST_REFUSAL_NAMESPACE_ARGUMENTS, "too_deep": pb.GUEST_REFUSAL_TOO_DEEP}


class _Watchdog:
    """Ends the process when a VM step overruns the deadline (second layer).

    The thread sleeps until the armed deadline plus grace, not in a polling
    loop. Arming wakes it only when the new limit is earlier than the one it
    sleeps towards, so the two arms per VM step (deadline, then disarm) cost
    no thread switch once a leg's deadline is known.
    """

    def __init__(self) -> None:
        self._deadline = float("inf")
        self._sleeping_until = float("inf")
        self._changed = threading.Condition()
        threading.Thread(target=self._run, name="cellblock-watchdog", daemon=True).start()

    def arm(self, deadline: float) -> None:
        with self._changed:
            self._deadline = deadline
            if deadline < self._sleeping_until:
                self._changed.notify()

    def _run(self) -> None:
        with self._changed:
            while True:
                deadline = self._deadline
                if deadline == float("inf"):
                    self._sleeping_until = deadline
                    self._changed.wait()
                    continue
                remaining = deadline + WATCHDOG_GRACE_S - time.monotonic()
                if remaining < 0:
                    os._exit(pb.CELL_EXIT_CODE_WATCHDOG)
                self._sleeping_until = deadline
                self._changed.wait(timeout=remaining)


class Leg:
    """Runs one leg over an attached bridge stream."""

    def __init__(self, token: str, memory_limit_bytes: int = 0, watchdog: _Watchdog | None = None) -> None:
        self._token = token
        self._memory_limit_bytes = memory_limit_bytes
        #: Messages for the host, written when the agent next waits for it.
        self._outgoing: list[pb.AttachRequest] = []
        self._watchdog = watchdog or _Watchdog()
        self._deadline = time.monotonic() + 60.0
        #: A read of the host's next message started ahead of :meth:`_next` (a resume's restore).
        self._read_ahead: asyncio.Future[Any] | None = None

    def _send(self, msg: pb.AttachRequest) -> None:
        self._outgoing.append(msg)

    async def _write_outgoing(self, call: Any) -> None:
        # Written on the stream directly (no request iterator, so no queue
        # hop and no task switch per message), in order, each awaited.
        outgoing, self._outgoing = self._outgoing, []
        for msg in outgoing:
            await call.write(msg)

    async def run(self, channel: grpc.aio.Channel) -> str:
        """Serves one leg on a new stream of ``channel``.

        Returns:
            The next leg's token when the host recycles the cell (SPEC §16.2),
            else ``""`` (the cell ends).
        """
        stub = pb_grpc.BridgeServiceStub(channel)
        # Prepared before the hello, so a cell counts as ready (attached) only
        # once its VM is: the leg's Start then pays for per-leg work alone.
        prepared = CellVM.prepared(memory_limit_bytes=self._memory_limit_bytes) if self._memory_limit_bytes > 0 else None
        self._send(pb.AttachRequest(hello=pb.Hello(cell_token=self._token, engine_build_id=engine_build_id())))
        call = stub.Attach()
        first = await self._next(call)
        if first.WhichOneof("message") != "start":
            raise RuntimeError("the host did not start the leg")
        start = first.start
        received = time.monotonic()
        deadline = received + start.limits.deadline_ms / 1000.0
        self._deadline = deadline
        if prepared is not None and prepared.memory_limit_bytes == start.limits.memory_limit_bytes:
            vm, prepared = prepared, None
            vm.deadline = deadline
        else:
            vm = CellVM(memory_limit_bytes=start.limits.memory_limit_bytes, deadline=deadline)
        if prepared is not None:
            prepared.close()
        end = await self._drive(vm, start, call)
        self._send(pb.AttachRequest(end=end))
        # Drain the host's side until it closes the stream; its last message
        # may recycle the cell for the next leg of the scope.
        next_token = ""
        try:
            await self._write_outgoing(call)
            await call.done_writing()
            while True:
                # A read started ahead and never awaited (a restore that failed) comes first.
                reading, self._read_ahead = self._read_ahead, None
                msg = await (reading if reading is not None else call.read())
                if msg is grpc.aio.EOF:
                    break
                if isinstance(msg, pb.AttachResponse) and msg.WhichOneof("message") == "recycle":
                    next_token = msg.recycle.next_cell_token
        except grpc.aio.AioRpcError:
            next_token = ""
        # Nothing of this leg's VM survives into the next: its engine
        # instance (the whole linear memory) is released here.
        vm.close()
        return next_token

    async def _drive(self, vm: CellVM, start: pb.Start, call: Any) -> pb.LegEnd:
        limits = start.limits
        config: dict[str, Any] = {
            "limits": {
                "maxPendingToolCalls": limits.max_pending_tool_calls,
                "replyInboxBytes": limits.reply_inbox_bytes,
                "maxOutputBytes": limits.max_output_bytes,
                "outputSpentBytes": limits.output_spent_bytes,
                "outputClosed": limits.output_closed,
            },
            "bridgeCounters": dict(start.bridge_counters),
            "nextTimerId": int(start.bridge_counters.get("timer", 0)) + 1,
        }
        try:
            if start.snapshot_bytes:
                chunks: list[bytes] = []
                while True:
                    msg = await self._next(call)
                    if msg.WhichOneof("message") != "snapshot_chunk":
                        raise RuntimeError("expected a snapshot chunk")
                    chunks.append(msg.snapshot_chunk.data)
                    if msg.snapshot_chunk.last:
                        break
                # The host sent the settlements due on resume right after the snapshot: the read
                # of the next message is under way in gRPC's own thread while the VM restores.
                self._read_ahead = asyncio.ensure_future(call.read())
                await asyncio.sleep(0)
                self._step(lambda: vm.restore(b"".join(chunks), config))
            else:
                # The catalog's text goes to the controller as the host sent it.
                self._step(lambda: vm.install(config, start.catalog_json or "{}"))
                self._step(lambda: vm.start(start.source))
            while True:
                # The report's outbox includes what reading the status ran (a
                # value's toJSON), so an end below needs no further flush.
                outbox, status = vm.report()
                self._forward(outbox)
                phase = status.get("phase")
                host_work = status.get("hostWork")
                if not isinstance(phase, str) or not isinstance(host_work, int | float):
                    raise RuntimeError("the controller returned an invalid status")
                # Guest text arrives as a JSON string literal and crosses on as one.
                message = str(status.get("failureMessage", '""'))
                if phase == "fulfilled" and host_work == 0:
                    return pb.LegEnd(completed=pb.Completed(value_json=str(status.get("valueJson", "null"))))
                if phase == "unserialisable":
                    return pb.LegEnd(failed=pb.Failed(kind=pb.FAILURE_KIND_UNSERIALISABLE, message=str(status.get("reason", ""))))
                if phase == "compile_error":
                    return pb.LegEnd(failed=pb.Failed(kind=pb.FAILURE_KIND_SYNTAX, message=message))
                if phase == "rejected":
                    if status.get("failureKind") == "bridge":
                        bridge_id = str(status.get("failureBridgeId", ""))
                        return pb.LegEnd(failed=pb.Failed(kind=pb.FAILURE_KIND_BRIDGE_REJECTION, message=message, rejection_bridge_id=bridge_id))
                    if _json_text(message).startswith(_ENGINE_OOM):
                        return pb.LegEnd(failed=pb.Failed(kind=pb.FAILURE_KIND_MEMORY, message=message[:200]))
                    return pb.LegEnd(failed=pb.Failed(kind=pb.FAILURE_KIND_GUEST_ERROR, message=message))
                if phase == "pending" and host_work == 0:
                    return pb.LegEnd(failed=pb.Failed(kind=pb.FAILURE_KIND_UNSETTLEABLE, message="pending with no host work"))
                if not start.idle_unneeded:
                    self._send(pb.AttachRequest(idle=pb.Idle(host_work=int(host_work))))
                ahead = await self._snapshot_ahead(vm, call, outbox)
                msg = await self._next(call)
                kind = msg.WhichOneof("message")
                if kind == "settle":
                    s = msg.settle
                    ok = s.WhichOneof("outcome") == "ok_json"
                    payload, code = (s.ok_json, "") if ok else (s.error.message, s.error.code)
                    self._step(functools.partial(vm.settle, s.bridge_id, ok, payload, code))
                elif kind == "suspend":
                    # The host suspends an idle guest at its deadline, so the deadline has
                    # passed: the flush and the snapshot run only the controller (no guest
                    # code, the host's watchdog bounds them), and the engine's interrupt
                    # check, counted across calls, must not poison the VM inside them.
                    vm.deadline = float("inf")
                    if ahead is None:
                        self._flush(vm)
                        ahead = vm.snapshot()
                    data, raw = ahead
                    chunk = pb.BRIDGE_LIMIT_SNAPSHOT_CHUNK_BYTES
                    for i in range(0, max(len(data), 1), chunk):
                        part = data[i : i + chunk]
                        self._send(pb.AttachRequest(snapshot_chunk=pb.SnapshotChunk(data=part, last=i + chunk >= len(data))))
                    # No guest code ran since the flush above: nothing more to send.
                    return pb.LegEnd(suspended=pb.Suspended(raw_bytes=raw, snapshot_bytes=len(data)))
                else:
                    raise RuntimeError(f"unexpected host message {kind}")
        except VMPoisonedError as exc:
            # What the VM produced before it was poisoned still counts: its
            # requests, output and omissions (so the result ends with its
            # truncation marker, SPEC §9).
            self._flush(vm, salvage=True)
            kinds = {"interrupted": pb.FAILURE_KIND_INTERRUPTED, "memory": pb.FAILURE_KIND_MEMORY, "trap": pb.FAILURE_KIND_ENGINE_TRAP}
            return pb.LegEnd(failed=pb.Failed(kind=kinds[exc.kind], message=exc.detail))
        except ControllerFaultError as exc:
            # Guest code broke something the controller relies on: the
            # program's own error, not a cell fault (SPEC §8.1 item 5).
            self._flush(vm, salvage=True)
            return pb.LegEnd(failed=pb.Failed(kind=pb.FAILURE_KIND_GUEST_ERROR, message=json.dumps(CONTROLLER_FAULT.format(exc.head))))

    async def _snapshot_ahead(self, vm: CellVM, call: Any, outbox: Outbox) -> tuple[bytes, int] | None:
        """Snapshots the VM while the host answers a yield, which parks the leg at once (SPEC §10.4 item 1).

        The requests go to the host first; the VM then makes no call until the host's
        answer, so the snapshot is the one :meth:`_drive` would take at ``Suspend`` (its
        flush finds nothing: the report just took the outbox). Any other answer (the
        yield refused, or another call's result first) discards it.

        Returns:
            ``(compressed_bytes, raw_size)``, or ``None`` when no yield went out (or the VM
            cannot be snapshotted now: then ``Suspend`` takes it as before).
        """
        if not any(item[0] == "r" and item[2] == "yield" for item in outbox.items):
            return None
        await self._write_outgoing(call)
        try:
            return vm.snapshot()
        except Exception:  # noqa: BLE001 - the snapshot at Suspend raises it again, handled there
            return None

    def _step(self, fn: Any) -> Any:
        """Runs one VM step under the watchdog (armed only while guest code runs)."""
        self._watchdog.arm(self._deadline)
        try:
            return fn()
        finally:
            self._watchdog.arm(float("inf"))

    async def _next(self, call: Any) -> pb.AttachResponse:
        """Writes what waits for the host, then reads its next message.

        A host silent long past the deadline ends the cell; a stream the host
        ended raises ``RuntimeError``.
        """
        timeout = max(1.0, self._deadline + HOST_SILENCE_GRACE_S - time.monotonic())
        try:
            # asyncio.timeout, not wait_for: no task per message.
            async with asyncio.timeout(timeout):
                await self._write_outgoing(call)
                reading, self._read_ahead = self._read_ahead, None
                msg = await (reading if reading is not None else call.read())
        except TimeoutError:
            print("cellblock-guest: the host went silent; ending the cell", file=sys.stderr)
            os._exit(pb.CELL_EXIT_CODE_HOST_SILENT)
        if not isinstance(msg, pb.AttachResponse):
            raise RuntimeError("the host ended the bridge stream")
        return msg

    def _flush(self, vm: CellVM, *, salvage: bool = False) -> None:
        """Forwards the controller's outbox to the host (one VM call per flush)."""
        self._forward(vm.salvage() if salvage else vm.take())

    def _forward(self, outbox: Outbox) -> None:
        """Sends an outbox's requests, output entries and omissions to the host."""
        for item in outbox.items:
            if item[0] == "r":
                _, bridge_id, method, args_json = item
                self._send(pb.AttachRequest(request=pb.GuestRequest(bridge_id=bridge_id, method=method, args_json=args_json)))
            elif item[0] == "x":
                _, method, refusal, first, count = item
                request = pb.GuestRequest(bridge_id=f"bridge:{method}:{first}", method=method, refusal=_REFUSALS[refusal], refused_count=count)
                self._send(pb.AttachRequest(request=request))
            else:
                self._send(pb.AttachRequest(output=pb.GuestOutput(entry_json=item[1])))
        if outbox.omitted_entries:
            omission = pb.OutputOmission(
                omitted_entries=outbox.omitted_entries,
                omitted_bytes=outbox.omitted_bytes,
                # Already a JSON string literal (lone surrogates stay escapes).
                first_omitted_content=outbox.first_omitted,
            )
            self._send(pb.AttachRequest(omission=omission))


def _channel(env: dict[str, str], options: list[tuple[str, Any]]) -> grpc.aio.Channel:
    """The bridge channel: the cell's unix socket, or the replica's TCP port (optionally mutual TLS)."""
    address = env.get(ADDRESS_ENV, "")
    if not address:
        return grpc.aio.insecure_channel(f"unix:{env.get(SOCKET_ENV, '/run/cellblock/bridge.sock')}", options=options)
    paths = [env.get(name, "") for name in TLS_ENV]
    if not any(paths):
        return grpc.aio.insecure_channel(address, options=options)
    if not all(paths):
        raise ValueError("TLS needs the CA, certificate and key")
    ca, cert, key = (open(path, "rb").read() for path in paths)  # noqa: SIM115 - small PEM files
    credentials = grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)
    name = env.get(TLS_NAME_ENV, "")
    if name:
        options = [*options, ("grpc.ssl_target_name_override", name)]
    return grpc.aio.secure_channel(address, credentials, options=options)


async def _amain() -> int:
    try:
        # Before the bridge: a cell whose engine cannot load never attaches.
        preload_engine()
    except EngineUnusableError as exc:
        print(f"cellblock-guest: {exc}", file=sys.stderr)
        return ENGINE_UNUSABLE_EXIT
    env = dict(os.environ)
    token = env.get(TOKEN_ENV, "")
    limit_text = env.get(MEMORY_LIMIT_ENV, "")
    memory_limit_bytes = int(limit_text) if limit_text.isdigit() else 0
    # Nothing else of the environment is needed; drop it so no value lingers.
    for key in list(os.environ):
        if key not in ("PATH", "PYTHONPATH", "HOME"):
            del os.environ[key]
    options: list[tuple[str, Any]] = [("grpc.max_send_message_length", pb.BRIDGE_LIMIT_MAX_MESSAGE_BYTES), ("grpc.max_receive_message_length", pb.BRIDGE_LIMIT_MAX_MESSAGE_BYTES)]
    try:
        channel = _channel(env, options)
    except (OSError, ValueError) as exc:
        print(f"cellblock-guest: bridge TLS material unusable ({exc.__class__.__name__})", file=sys.stderr)
        return pb.CELL_EXIT_CODE_BRIDGE_UNREACHABLE
    async with channel:
        try:
            await asyncio.wait_for(channel.channel_ready(), timeout=10)
        except (TimeoutError, grpc.aio.AioRpcError):
            print("cellblock-guest: bridge unreachable", file=sys.stderr)
            return pb.CELL_EXIT_CODE_BRIDGE_UNREACHABLE
        watchdog = _Watchdog()
        # One leg, or under cell reuse (SPEC §16.2) consecutive legs of one
        # scope, each with a fresh VM and its own token.
        token = await Leg(token, memory_limit_bytes, watchdog).run(channel)
        while token:
            token = await Leg(token, memory_limit_bytes, watchdog).run(channel)
    return pb.CELL_EXIT_CODE_UNSPECIFIED


def main() -> None:
    """Entry point of ``python -m cellblock.guest``.

    Ends with ``os._exit`` once the bridge channel is closed: the process has
    nothing left to release (its container is removed next), and the
    interpreter's own shutdown cost each cell about 20 ms of CPU.
    """
    code = asyncio.run(_amain())
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _json_text(literal: str) -> str:
    """Decodes a JSON string literal from the controller ("" when malformed)."""
    try:
        value = json.loads(literal)
    except ValueError:
        return ""
    return value if isinstance(value, str) else ""
