"""A hostile guest agent for the bridge fuzzer (test only; runs inside a real locked-down cell).

It replaces the cell's guest agent (``DockerExecutorConfig.test_guest_command``). It
attaches with its token (or a wrong one, when the plan says so), takes ``start``, then
sends the plan's messages as raw bytes, exactly as generated: valid and invalid
``AttachRequest`` messages and bytes that are no protobuf at all, in any order. It
reads whatever the host answers and counts the settles it gets, writes nothing back,
and exits when the plan is sent and the host has gone quiet.

Plan file (``/fuzz-data/plan.bin``, read-only mount): one byte ``1``/``0`` (correct
token or not), then ``<u32 big-endian length><bytes>`` per message.
"""

import asyncio
import os
import struct
import sys

import grpc

from cellblock.bridge.v1 import bridge_service_pb2 as pb

PLAN = "/fuzz-data/plan.bin"
ATTACH = "/cellblock.bridge.v1.BridgeService/Attach"


def read_plan() -> tuple[bool, list[bytes]]:
    with open(PLAN, "rb") as f:
        data = f.read()
    good_token, offset, messages = data[:1] == b"1", 1, []
    while offset + 4 <= len(data):
        (size,) = struct.unpack(">I", data[offset : offset + 4])
        messages.append(data[offset + 4 : offset + 4 + size])
        offset += 4 + size
    return good_token, messages


async def main() -> int:
    good_token, messages = read_plan()
    token = os.environ.get("CELLBLOCK_CELL_TOKEN", "") if good_token else "not-the-token"
    hello = pb.AttachRequest(hello=pb.Hello(cell_token=token, engine_build_id="fuzz")).SerializeToString()
    queue: asyncio.Queue[bytes | None] = asyncio.Queue()
    await queue.put(hello)

    async def requests():  # type: ignore[no-untyped-def]
        while True:
            item = await queue.get()
            if item is None:
                return
            yield item

    async with grpc.aio.insecure_channel("unix:" + os.environ["CELLBLOCK_BRIDGE_SOCKET"]) as channel:
        call = channel.stream_stream(ATTACH, request_serializer=lambda b: b, response_deserializer=lambda b: b)(requests())
        settles = 0
        try:
            first = await asyncio.wait_for(call.read(), timeout=10)
            if first is grpc.aio.EOF:
                return 0
            for message in messages:
                await queue.put(message)

            async def drain() -> None:
                nonlocal settles
                while True:
                    item = await call.read()
                    if item is grpc.aio.EOF:
                        return
                    if pb.AttachResponse.FromString(item).WhichOneof("message") == "settle":
                        settles += 1

            await asyncio.wait_for(drain(), timeout=8)
        except (TimeoutError, grpc.aio.AioRpcError):
            pass
        finally:
            await queue.put(None)
        print(f"fuzz-guest: sent {len(messages)} messages, got {settles} settles", file=sys.stderr)
    return 0


sys.exit(asyncio.run(main()))
