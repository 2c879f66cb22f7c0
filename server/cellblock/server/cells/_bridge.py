"""The host end of the cells' bridges: gRPC ``BridgeService.Attach``.

Two transports carry the same protocol (SPEC §15 item 1, §16.3 item 2):

- **unix** (Docker, process): each cell gets a private directory holding one
  unix socket, bind-mounted into its container as its only mount; one gRPC
  server per cell.
- **tcp** (Kubernetes): one :class:`BridgeListener` per replica on its bridge
  port, shared by all of the replica's cells. The ``hello``'s token selects the
  cell, so a cell can only ever reach its own bridge.

Either way a connection must authenticate with its cell's one-time token as its
first message; a wrong or reused token is refused (PERMISSION_DENIED). On the TCP
port, reachable by every cell pod, a connection that has not authenticated within
``limits.BRIDGE_HELLO_TIMEOUT_S`` is closed too (DEADLINE_EXCEEDED); a unix socket
only its own cell can open, and the leg's attach timeout bounds that wait.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import os
import secrets
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
from google.protobuf.message import DecodeError

from cellblock.bridge.v1 import bridge_service_pb2 as pb
from cellblock.server.config import MAX_BRIDGE_MESSAGE_BYTES
from cellblock.server.limits import BRIDGE_HELLO_TIMEOUT_S, WARM_PING_INTERVAL_MS, WARM_PING_TIMEOUT_MS

SOCKET_NAME = "bridge.sock"
_HELLO_TIMEOUT_MS = int(BRIDGE_HELLO_TIMEOUT_S * 1000)
#: The bound of a bridge opened without one (the TCP listener shared by a replica's cells):
#: the largest message any run may need.
DEFAULT_MAX_MESSAGE_BYTES = MAX_BRIDGE_MESSAGE_BYTES


def _message_options(max_receive_bytes: int) -> list[tuple[str, int]]:
    """Message size options: the cell's messages are refused beyond ``max_receive_bytes``, unread."""
    return [
        ("grpc.max_send_message_length", pb.BRIDGE_LIMIT_MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", max_receive_bytes),
    ]


#: Options of a warm cell's bridge: the host pings the cell's connection (HTTP/2 PING, answered by the
#: agent's gRPC runtime) and closes it when a ping goes unanswered, so a frozen cell (paused, stopped,
#: its agent hung) loses its stream, which the pool sees before handing the cell out.
_PING_OPTIONS = [
    ("grpc.keepalive_time_ms", WARM_PING_INTERVAL_MS),
    ("grpc.keepalive_timeout_ms", WARM_PING_TIMEOUT_MS),
    ("grpc.http2.ping_timeout_ms", WARM_PING_TIMEOUT_MS),
    ("grpc.http2.max_pings_without_data", 0),
]

#: TCP listener options: a connection that never completes the HTTP/2
#: handshake, or holds no stream, is closed after the hello timeout.
_TCP_OPTIONS = [
    *_message_options(DEFAULT_MAX_MESSAGE_BYTES),
    ("grpc.server_handshake_timeout_ms", _HELLO_TIMEOUT_MS),
    ("grpc.max_connection_idle_ms", _HELLO_TIMEOUT_MS),
    # A connection takes new streams only within the hello timeout (then GOAWAY; the one
    # Attach stream of a cell lives on, grace unbounded): an unauthenticated peer cannot keep
    # a connection open by opening stream after stream, nor try token after token on it.
    ("grpc.max_connection_age_ms", _HELLO_TIMEOUT_MS),
    ("grpc.so_reuseport", 0),
]


def _serialize(message: pb.AttachResponse | bytes) -> bytes:
    """A host message's wire form; ``bytes`` are one already serialized (:meth:`CellBridge.send`)."""
    return message if isinstance(message, bytes) else message.SerializeToString()


def _add_servicer(servicer: _Servicer, server: grpc.aio.Server) -> None:
    """Registers ``servicer`` like the generated ``add_BridgeServiceServicer_to_server``, with :func:`_serialize`."""
    handlers = {"Attach": grpc.stream_stream_rpc_method_handler(servicer.Attach, request_deserializer=pb.AttachRequest.FromString, response_serializer=_serialize)}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(_SERVICE, handlers),))
    server.add_registered_method_handlers(_SERVICE, handlers)


_SERVICE = pb.DESCRIPTOR.services_by_name["BridgeService"].full_name


class _Servicer:
    """Authenticates each ``Attach`` by its first message and pumps it into the cell's bridge."""

    def __init__(self, resolve: Callable[[str], CellBridge | None], *, hello_timeout_s: float | None) -> None:
        self._resolve = resolve
        self._hello_timeout_s = hello_timeout_s

    async def Attach(  # noqa: N802 - gRPC method name
        self, request_iterator: AsyncIterator[pb.AttachRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.AttachResponse | bytes]:
        iterator = request_iterator.__aiter__()
        try:
            first = await asyncio.wait_for(iterator.__anext__(), timeout=self._hello_timeout_s)
        except StopAsyncIteration:
            return
        except TimeoutError:
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "no hello within the bridge's authentication timeout")
        if first.WhichOneof("message") != "hello":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the first bridge message must be hello")
        bridge = self._resolve(first.hello.cell_token)
        if bridge is None or bridge.token_used or not hmac.compare_digest(first.hello.cell_token, bridge.token):
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, "invalid or reused cell token")
        assert bridge is not None
        bridge.token_used = True
        bridge.engine_build_id = first.hello.engine_build_id
        bridge.attached.set()
        # This stream serves one leg: what it reads and writes stays with that
        # leg even once the bridge is re-armed for the next (CellBridge.recycle).
        generation, outbox = bridge.generation, bridge.outbox

        async def pump() -> None:
            try:
                async for msg in iterator:
                    bridge.received(msg, generation)
            except DecodeError:
                # Bytes that are no AttachRequest: the leg reads a message with no known content
                # and ends as an invalid cell response ([R17], SPEC §14.5), not at its watchdog.
                bridge.received(pb.AttachRequest(), generation)
            except (grpc.aio.AioRpcError, asyncio.CancelledError):
                pass
            finally:
                bridge.received(None, generation)

        reader = asyncio.create_task(pump())
        try:
            while True:
                out = await outbox.get()
                if out is None:
                    return
                yield out
        finally:
            reader.cancel()


class CellBridge:
    """The bridge endpoint of one cell.

    Attributes:
        directory: Host path of the cell's private socket directory (unix
            transport; mount it into the cell, and nothing else); ``""`` on TCP.
        token: The one-time cell token (64 hex digits) to pass to the cell.
        inbox: Guest messages in arrival order; ``None`` marks the stream's end.
        outbox: Host messages to send (a message, or its serialized bytes); ``None`` closes the stream.
        attached: Set once the cell authenticated.
        max_message_bytes: The largest message read from the cell (unix transport; a longer
            one ends the cell's stream unread, SPEC §2.3).
        ping: The host pings the cell's connection and ends its stream when it goes unanswered
            (warm cells, unix transport).
    """

    def __init__(self, directory: str = "", *, socket_uid: int = -1, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES, ping: bool = False) -> None:
        self.directory = directory
        self.max_message_bytes = max_message_bytes
        self.ping = ping
        self.token = secrets.token_hex(32)
        self.token_used = False
        self.engine_build_id = ""
        self.inbox: asyncio.Queue[pb.AttachRequest | None] = asyncio.Queue()
        self.outbox: asyncio.Queue[pb.AttachResponse | bytes | None] = asyncio.Queue()
        self.attached = asyncio.Event()
        self._socket_uid = socket_uid
        self._server: grpc.aio.Server | None = None
        self._on_close: Callable[[], None] | None = None
        self._sink: Callable[[pb.AttachRequest | None], None] | None = None
        self._on_rekey: Callable[[str, str], None] | None = None
        #: Counts the legs this bridge was armed for (:meth:`recycle`).
        self.generation = 0

    def received(self, msg: pb.AttachRequest | None, generation: int) -> None:
        """Takes one guest message (``None``: the stream ended) from the stream of leg ``generation``.

        A message of an earlier leg's stream (it ends after :meth:`recycle`) is dropped.
        """
        if generation != self.generation:
            return
        if self._sink is not None:
            self._sink(msg)
        else:
            self.inbox.put_nowait(msg)

    def deliver_to(self, sink: Callable[[pb.AttachRequest | None], None]) -> None:
        """Hands every guest message to ``sink`` from now on, those already in :attr:`inbox` first.

        The leg that owns the cell calls this once: messages then reach its
        event queue with no queue and task in between.
        """
        while not self.inbox.empty():
            sink(self.inbox.get_nowait())
        self._sink = sink

    @property
    def socket_path(self) -> str:
        """Host path of the unix socket."""
        return os.path.join(self.directory, SOCKET_NAME)

    @classmethod
    async def open(cls, base_dir: str, *, socket_uid: int, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES, ping: bool = False) -> CellBridge:
        """Creates the cell's socket directory and starts its bridge server (unix transport).

        Args:
            base_dir: Parent directory for per-cell socket directories.
            socket_uid: The cell's uid, which must be able to connect.
            max_message_bytes: The largest message the server reads from the cell (the
                run's ``bridge_message_bytes``).
            ping: Ping the cell's connection (a warm cell: :data:`_PING_OPTIONS`).

        Raises:
            OSError: The directory or socket could not be created.
        """
        os.makedirs(base_dir, mode=0o711, exist_ok=True)
        directory = tempfile.mkdtemp(prefix="cell-", dir=base_dir)
        bridge = cls(directory, socket_uid=socket_uid, max_message_bytes=max_message_bytes, ping=ping)
        try:
            await bridge._start()
        except BaseException:
            shutil.rmtree(directory, ignore_errors=True)
            raise
        return bridge

    async def _start(self) -> None:
        server = grpc.aio.server(options=_message_options(self.max_message_bytes) + (_PING_OPTIONS if self.ping else []))
        _add_servicer(_Servicer(lambda _token: self, hello_timeout_s=None), server)
        server.add_insecure_port(f"unix:{self.socket_path}")
        await server.start()
        self._server = server
        # Only the cell's uid may enter the directory and use the socket.
        os.chown(self.directory, self._socket_uid, self._socket_uid)
        os.chmod(self.directory, 0o700)
        os.chown(self.socket_path, self._socket_uid, self._socket_uid)
        os.chmod(self.socket_path, 0o600)

    def send(self, msg: pb.AttachResponse | bytes) -> None:
        """Queues a message for the cell: an ``AttachResponse`` or its serialized bytes.

        Bytes go out as they are: a leg's ``Start`` carries megabytes of catalog serialized
        once per catalog version (``runs.start_message``), not again on the event loop for
        every leg (SPEC §2.3 "loop hold").
        """
        self.outbox.put_nowait(msg)

    def recycle(self) -> None:
        """Hands the cell to the next leg of its scope (SPEC §16.2 items 2-3).

        Sends the cell the next leg's one-time token (``Recycle``), ends this
        leg's stream, and re-arms the bridge: a new token, nothing attached,
        empty queues. The cell's agent then releases its VM, prepares a fresh
        one and attaches again with the new token; the old token is refused
        from now on. Call only after the guest's ``end``.
        """
        token = secrets.token_hex(32)
        self.outbox.put_nowait(pb.AttachResponse(recycle=pb.Recycle(next_cell_token=token)))
        self.outbox.put_nowait(None)
        old, self.token = self.token, token
        self.token_used = False
        self.engine_build_id = ""
        self.inbox = asyncio.Queue()
        self.outbox = asyncio.Queue()
        self.attached = asyncio.Event()
        self._sink = None
        self.generation += 1
        if self._on_rekey is not None:
            self._on_rekey(old, token)

    def hang_up(self) -> None:
        """Ends the cell's stream now; nothing more reaches the cell. Idempotent."""
        self.outbox.put_nowait(None)

    async def close(self) -> None:
        """Ends the cell's stream, stops its transport and removes its socket directory. Idempotent."""
        self.outbox.put_nowait(None)
        if self._on_close is not None:
            on_close, self._on_close = self._on_close, None
            on_close()
        if self._server is not None:
            server, self._server = self._server, None
            await server.stop(grace=0.2)
        if self.directory:
            shutil.rmtree(self.directory, ignore_errors=True)


@dataclass(frozen=True)
class BridgeTls:
    """PEM files for a TCP bridge with mutual TLS (SPEC §16.3 item 2).

    Attributes:
        ca: CA that signed the cells' client certificate (and the server's).
        cert: The replica's server certificate chain.
        key: The replica's private key.
    """

    ca: Path
    cert: Path
    key: Path

    def server_credentials(self) -> grpc.ServerCredentials:
        """Server credentials that require a client certificate signed by :attr:`ca`."""
        pair = (Path(self.key).read_bytes(), Path(self.cert).read_bytes())
        return grpc.ssl_server_credentials([pair], root_certificates=Path(self.ca).read_bytes(), require_client_auth=True)


def _token_key(token: str) -> bytes:
    # Cells are looked up by a digest of the token, never by comparing secrets
    # byte by byte (the final check is hmac.compare_digest).
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


class BridgeListener:
    """The replica's TCP bridge port, shared by every cell it starts (Kubernetes, SPEC §16.3 item 2).

    Args:
        bind: ``host:port`` to listen on (port 0 picks one).
        tls: Mutual TLS material; ``None`` serves plain TCP (token only).

    Attributes:
        port: The bound port (after :meth:`start`).
    """

    def __init__(self, bind: str, *, tls: BridgeTls | None = None) -> None:
        self._bind = bind
        self._tls = tls
        self._bridges: dict[bytes, CellBridge] = {}
        self._server: grpc.aio.Server | None = None
        self._starting = asyncio.Lock()
        self.port = 0

    async def start(self) -> None:
        """Binds the port and starts serving; concurrent and repeated calls bind once.

        Raises:
            OSError: The port could not be bound, or the TLS files cannot be read.
        """
        async with self._starting:
            if self._server is None:
                await self._start()

    async def _start(self) -> None:
        server = grpc.aio.server(options=_TCP_OPTIONS)
        _add_servicer(_Servicer(lambda token: self._bridges.get(_token_key(token)), hello_timeout_s=BRIDGE_HELLO_TIMEOUT_S), server)
        try:
            if self._tls is not None:
                self.port = server.add_secure_port(self._bind, self._tls.server_credentials())
            else:
                self.port = server.add_insecure_port(self._bind)
        except RuntimeError as exc:
            raise OSError(f"the bridge port {self._bind} could not be bound ({exc})") from None
        await server.start()
        self._server = server

    def open(self) -> CellBridge:
        """Registers a new cell bridge (its own one-time token) on this port."""
        bridge = CellBridge()
        keys = [_token_key(bridge.token)]
        self._bridges[keys[0]] = bridge

        def forget() -> None:
            self._bridges.pop(keys[0], None)

        def rekey(old: str, new: str) -> None:
            # A recycled cell's next leg attaches with its new token only.
            self._bridges.pop(_token_key(old), None)
            keys[0] = _token_key(new)
            self._bridges[keys[0]] = bridge

        bridge._on_close = forget
        bridge._on_rekey = rekey
        return bridge

    @property
    def open_bridges(self) -> int:
        """Bridges registered and not yet closed."""
        return len(self._bridges)

    async def close(self) -> None:
        """Stops the port; cells still attached lose their stream."""
        if self._server is not None:
            server, self._server = self._server, None
            await server.stop(grace=0.2)
