"""A hostile guest agent for the bridge fuzzer (test only; runs inside a real locked-down cell).

It replaces the cell's guest agent (``DockerExecutorConfig.test_guest_command``). It
attaches with its token (or a wrong one, when the plan says so), takes ``start``, then
sends the plan's messages as raw bytes, exactly as generated: valid and invalid
``AttachRequest`` messages and bytes that are no protobuf at all, in any order.

The plan carries, for every message, the answer docs/SPEC.md documents for it
(``tests/support/bridge_oracle.py``). The agent records every ``Settle`` that comes
back, one JSON line each, as it arrives (``/fuzz-out/answers.jsonl``, the test's writable
mount), so the test can compare what the cell really got with the documented answers.
Before it sends the message that ends the leg, it waits (at most 5 s) until the answers the
host owes at once (``immediate``) have arrived: the host closes the stream and removes the
cell when the leg ends, and answers still in flight would be lost with it. It writes
nothing back to the host but the plan, and exits when the host ends the stream (a plan
with no message that ends the leg is silent until the host's watchdog kills the cell).

Plan file (``/fuzz-data/plan.json``, read-only mount): ``{"goodToken": bool, "messages":
[base64, ...], "answers": [{"kind", "bridgeId", "message", "immediate"}, ...], "read": n,
"immediate": n}`` (``answers[i]`` documents ``messages[i]`` for ``i < read``).
"""

import asyncio
import base64
import collections
import json
import os
import sys

import grpc

from cellblock.bridge.v1 import bridge_service_pb2 as pb

PLAN = "/fuzz-data/plan.json"
ANSWERS = "/fuzz-out/answers.jsonl"
ATTACH = "/cellblock.bridge.v1.BridgeService/Attach"


class Record:
    """The answers the cell got, written as they arrive; ``settled`` once those owed at once are in."""

    def __init__(self, plan: dict) -> None:  # type: ignore[type-arg]
        read = plan["read"]
        self.owed = collections.Counter(a["bridgeId"] for a in plan["answers"][:read] if a["immediate"])
        self.settled = asyncio.Event()
        if not self.owed:
            self.settled.set()
        self.got = 0
        self._file = open(ANSWERS, "a", encoding="utf-8", buffering=1)  # noqa: SIM115 - open for the agent's whole life

    def add(self, s: pb.Settle) -> None:
        ok = s.WhichOneof("outcome") == "ok_json"
        self._file.write(json.dumps({"bridgeId": s.bridge_id, "ok": ok, "message": "" if ok else s.error.message, "code": "" if ok else s.error.code}) + "\n")
        self.got += 1
        if self.owed[s.bridge_id] > 0:
            self.owed[s.bridge_id] -= 1
            if self.owed[s.bridge_id] == 0:
                del self.owed[s.bridge_id]
        if not self.owed:
            self.settled.set()

    def close(self) -> None:
        self._file.close()


async def drain(call, record: Record) -> None:  # type: ignore[no-untyped-def]
    """Reads the host's messages until the stream ends, recording each ``Settle``."""
    while True:
        item = await call.read()
        if item is grpc.aio.EOF:
            return
        reply = pb.AttachResponse.FromString(item)
        if reply.WhichOneof("message") == "settle":
            record.add(reply.settle)


async def main() -> int:
    with open(PLAN, encoding="utf-8") as f:
        plan = json.load(f)
    messages = [base64.b64decode(m) for m in plan["messages"]]
    token = os.environ.get("CELLBLOCK_CELL_TOKEN", "") if plan["goodToken"] else "not-the-token"
    queue: asyncio.Queue[bytes | None] = asyncio.Queue()
    await queue.put(pb.AttachRequest(hello=pb.Hello(cell_token=token, engine_build_id="fuzz")).SerializeToString())
    # The message that ends the leg waits until the answers owed before it have arrived.
    read = plan["read"]
    pause_at = read - 1 if read and plan["answers"][read - 1]["kind"] == "ends the leg" else len(messages)
    record = Record(plan)

    async def requests():  # type: ignore[no-untyped-def]
        while (item := await queue.get()) is not None:
            yield item

    async with grpc.aio.insecure_channel("unix:" + os.environ["CELLBLOCK_BRIDGE_SOCKET"]) as channel:
        call = channel.stream_stream(ATTACH, request_serializer=lambda b: b, response_deserializer=lambda b: b)(requests())
        try:
            if await asyncio.wait_for(call.read(), timeout=10) is grpc.aio.EOF:
                return 0
            reader = asyncio.ensure_future(drain(call, record))
            for message in messages[:pause_at]:
                await queue.put(message)
            try:
                await asyncio.wait_for(record.settled.wait(), timeout=5)
            except TimeoutError:
                print(f"fuzz-guest: {sum(record.owed.values())} owed answers never arrived", file=sys.stderr)
            for message in messages[pause_at:]:
                await queue.put(message)
            # Silent until the host ends the stream: at the leg's end, or (a plan without one) the watchdog's kill.
            await asyncio.wait_for(reader, timeout=60)
        except (TimeoutError, grpc.aio.AioRpcError):
            pass
        finally:
            await queue.put(None)
            record.close()
        print(f"fuzz-guest: sent {len(messages)} messages, got {record.got} settles", file=sys.stderr)
    return 0


sys.exit(asyncio.run(main()))
