"""The host end of one cell's bridge: a gRPC server on the cell's own socket.

Each cell gets a private directory holding one unix socket, bind-mounted into
its container as the container's only mount. The server accepts exactly one
``Attach`` stream carrying the one-time cell token; a second attach, or a wrong
token, is refused with PERMISSION_DENIED.
"""

from __future__ import annotations

import asyncio
import hmac
import os
import secrets
import shutil
import tempfile
from collections.abc import AsyncIterator

import grpc

from cellblock.bridge.v1 import bridge_service_pb2 as pb
from cellblock.bridge.v1 import bridge_service_pb2_grpc as pb_grpc

SOCKET_NAME = "bridge.sock"


class _Servicer(pb_grpc.BridgeServiceServicer):
    def __init__(self, bridge: CellBridge) -> None:
        self._bridge = bridge

    async def Attach(  # noqa: N802 - gRPC method name
        self, request_iterator: AsyncIterator[pb.AttachRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.AttachResponse]:
        bridge = self._bridge
        iterator = request_iterator.__aiter__()
        try:
            first = await iterator.__anext__()
        except StopAsyncIteration:
            return
        if first.WhichOneof("message") != "hello":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the first bridge message must be hello")
        if bridge.token_used or not hmac.compare_digest(first.hello.cell_token, bridge.token):
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, "invalid or reused cell token")
        bridge.token_used = True
        bridge.engine_build_id = first.hello.engine_build_id
        bridge.attached.set()

        async def pump() -> None:
            try:
                async for msg in iterator:
                    await bridge.inbox.put(msg)
            except (grpc.aio.AioRpcError, asyncio.CancelledError):
                pass
            finally:
                await bridge.inbox.put(None)

        reader = asyncio.create_task(pump())
        try:
            while True:
                out = await bridge.outbox.get()
                if out is None:
                    return
                yield out
        finally:
            reader.cancel()


class CellBridge:
    """The bridge endpoint of one cell.

    Attributes:
        directory: Host path of the cell's private socket directory; mount it
            into the cell, and nothing else.
        token: The one-time cell token (64 hex digits) to pass to the cell.
        inbox: Guest messages in arrival order; ``None`` marks the stream's end.
        outbox: Host messages to send; ``None`` closes the stream.
        attached: Set once the cell authenticated.
    """

    def __init__(self, directory: str, *, socket_uid: int) -> None:
        self.directory = directory
        self.token = secrets.token_hex(32)
        self.token_used = False
        self.engine_build_id = ""
        self.inbox: asyncio.Queue[pb.AttachRequest | None] = asyncio.Queue()
        self.outbox: asyncio.Queue[pb.AttachResponse | None] = asyncio.Queue()
        self.attached = asyncio.Event()
        self._socket_uid = socket_uid
        self._server: grpc.aio.Server | None = None

    @property
    def socket_path(self) -> str:
        """Host path of the unix socket."""
        return os.path.join(self.directory, SOCKET_NAME)

    @classmethod
    async def open(cls, base_dir: str, *, socket_uid: int) -> CellBridge:
        """Creates the cell's socket directory and starts its bridge server.

        Args:
            base_dir: Parent directory for per-cell socket directories.
            socket_uid: The cell's uid, which must be able to connect.

        Raises:
            OSError: The directory or socket could not be created.
        """
        os.makedirs(base_dir, mode=0o711, exist_ok=True)
        directory = tempfile.mkdtemp(prefix="cell-", dir=base_dir)
        bridge = cls(directory, socket_uid=socket_uid)
        try:
            await bridge._start()
        except BaseException:
            shutil.rmtree(directory, ignore_errors=True)
            raise
        return bridge

    async def _start(self) -> None:
        options = [
            ("grpc.max_send_message_length", pb.BRIDGE_LIMIT_MAX_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", pb.BRIDGE_LIMIT_MAX_MESSAGE_BYTES),
        ]
        server = grpc.aio.server(options=options)
        pb_grpc.add_BridgeServiceServicer_to_server(_Servicer(self), server)
        server.add_insecure_port(f"unix:{self.socket_path}")
        await server.start()
        self._server = server
        # Only the cell's uid may enter the directory and use the socket.
        os.chown(self.directory, self._socket_uid, self._socket_uid)
        os.chmod(self.directory, 0o700)
        os.chown(self.socket_path, self._socket_uid, self._socket_uid)
        os.chmod(self.socket_path, 0o600)

    def send(self, msg: pb.AttachResponse) -> None:
        """Queues a message for the cell."""
        self.outbox.put_nowait(msg)

    async def close(self) -> None:
        """Stops the server and removes the socket directory. Idempotent."""
        self.outbox.put_nowait(None)
        if self._server is not None:
            server, self._server = self._server, None
            await server.stop(grace=0.2)
        shutil.rmtree(self.directory, ignore_errors=True)
