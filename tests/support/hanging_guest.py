"""A misbehaving guest agent for tests: it attaches, takes its program, then hangs.

It stands in for a cell whose engine ignores every interrupt and whose own
watchdog failed, so only the host's watchdog (deadline + 2000 ms) can end it.
"""

import asyncio
import os
import time

import grpc

from cellblock.bridge.v1 import bridge_service_pb2 as pb
from cellblock.bridge.v1 import bridge_service_pb2_grpc as pb_grpc


async def main() -> None:
    async with grpc.aio.insecure_channel("unix:" + os.environ["CELLBLOCK_BRIDGE_SOCKET"]) as channel:
        queue: asyncio.Queue[pb.AttachRequest] = asyncio.Queue()
        await queue.put(pb.AttachRequest(hello=pb.Hello(cell_token=os.environ["CELLBLOCK_CELL_TOKEN"], engine_build_id="hang")))

        async def requests():  # type: ignore[no-untyped-def]
            while True:
                yield await queue.get()

        call = pb_grpc.BridgeServiceStub(channel).Attach(requests())
        await call.read()  # the Start message
        time.sleep(3600)  # blocks the event loop like a stuck engine built-in


asyncio.run(main())
