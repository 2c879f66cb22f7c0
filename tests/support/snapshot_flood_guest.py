"""A hostile guest agent that floods the host with snapshot chunks (test only; runs in a real cell).

It replaces the cell's guest agent (``DockerExecutorConfig.test_guest_command``). The mode file
(``/flood-data/mode``, read-only mount) holds ``<mode> <MiB>``:

- ``unrequested``: right after ``start``, sends ``<MiB>`` 1 MiB snapshot chunks the host never
  asked for (no ``suspend``), then waits.
- ``requested``: asks to yield, and on the host's ``suspend`` sends ``<MiB>`` 1 MiB chunks and a
  ``suspended`` end that reports them all.
"""

import asyncio
import os
import sys
from typing import Any

import grpc

from cellblock.bridge.v1 import bridge_service_pb2 as pb

ATTACH = "/cellblock.bridge.v1.BridgeService/Attach"


async def flood(queue: "asyncio.Queue[bytes | None]", mib: int) -> None:
    """Queues ``mib`` 1 MiB snapshot chunks, a few at a time."""
    chunk = pb.AttachRequest(snapshot_chunk=pb.SnapshotChunk(data=b"s" * (1024 * 1024), last=False)).SerializeToString()
    for _ in range(mib):
        await queue.put(chunk)
        while queue.qsize() > 4:
            await asyncio.sleep(0.001)


async def requested(call: Any, queue: "asyncio.Queue[bytes | None]", mib: int) -> None:
    """Asks to yield, floods chunks after the host's ``suspend``, then ends ``suspended``."""
    request = pb.GuestRequest(bridge_id="bridge:yield:1", method="yield", args_json="[null]")
    await queue.put(pb.AttachRequest(request=request).SerializeToString())
    await queue.put(pb.AttachRequest(idle=pb.Idle(host_work=1)).SerializeToString())
    while True:
        item = await asyncio.wait_for(call.read(), timeout=10)
        if item is grpc.aio.EOF:
            return
        if pb.AttachResponse.FromString(item).WhichOneof("message") == "suspend":
            break
    await flood(queue, mib)
    end = pb.LegEnd(suspended=pb.Suspended(raw_bytes=mib * 1024 * 1024, snapshot_bytes=mib * 1024 * 1024))
    await queue.put(pb.AttachRequest(end=end).SerializeToString())


async def main() -> int:
    with open("/flood-data/mode") as f:
        mode, mib_text = f.read().split()
    mib = int(mib_text)
    queue: asyncio.Queue[bytes | None] = asyncio.Queue()
    token = os.environ.get("CELLBLOCK_CELL_TOKEN", "")
    await queue.put(pb.AttachRequest(hello=pb.Hello(cell_token=token, engine_build_id="flood")).SerializeToString())

    async def requests():  # type: ignore[no-untyped-def]
        while True:
            item = await queue.get()
            if item is None:
                return
            yield item

    async with grpc.aio.insecure_channel("unix:" + os.environ["CELLBLOCK_BRIDGE_SOCKET"]) as channel:
        call = channel.stream_stream(ATTACH, request_serializer=lambda b: b, response_deserializer=lambda b: b)(requests())
        try:
            await asyncio.wait_for(call.read(), timeout=10)  # start
            if mode == "unrequested":
                await flood(queue, mib)
            else:
                await requested(call, queue, mib)
            while await asyncio.wait_for(call.read(), timeout=20) is not grpc.aio.EOF:
                pass
        except (TimeoutError, grpc.aio.AioRpcError):
            pass
        finally:
            await queue.put(None)
    print(f"snapshot-flood-guest: {mode}, {mib} MiB sent", file=sys.stderr)
    return 0


sys.exit(asyncio.run(main()))
