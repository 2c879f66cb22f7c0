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
nothing back to the host but the plan, and exits when the plan is sent and the host has
gone quiet.

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


async def main() -> int:
    with open(PLAN, encoding="utf-8") as f:
        plan = json.load(f)
    messages = [base64.b64decode(m) for m in plan["messages"]]
    token = os.environ.get("CELLBLOCK_CELL_TOKEN", "") if plan["goodToken"] else "not-the-token"
    hello = pb.AttachRequest(hello=pb.Hello(cell_token=token, engine_build_id="fuzz")).SerializeToString()
    queue: asyncio.Queue[bytes | None] = asyncio.Queue()
    await queue.put(hello)
    # The answers owed at once for the messages before the one that ends the leg.
    owed = collections.Counter(a["bridgeId"] for a in plan["answers"][: plan["read"]] if a["immediate"])
    pause_at = plan["read"] - 1 if plan["read"] and plan["answers"][plan["read"] - 1]["kind"] == "ends the leg" else len(messages)
    settled = asyncio.Event()
    if not owed:
        settled.set()

    async def requests():  # type: ignore[no-untyped-def]
        while True:
            item = await queue.get()
            if item is None:
                return
            yield item

    record = open(ANSWERS, "a", encoding="utf-8", buffering=1)  # noqa: SIM115 - open for the agent's whole life
    got = 0
    async with grpc.aio.insecure_channel("unix:" + os.environ["CELLBLOCK_BRIDGE_SOCKET"]) as channel:
        call = channel.stream_stream(ATTACH, request_serializer=lambda b: b, response_deserializer=lambda b: b)(requests())

        async def drain() -> None:
            nonlocal got
            while True:
                item = await call.read()
                if item is grpc.aio.EOF:
                    return
                reply = pb.AttachResponse.FromString(item)
                if reply.WhichOneof("message") != "settle":
                    continue
                s = reply.settle
                ok = s.WhichOneof("outcome") == "ok_json"
                record.write(json.dumps({"bridgeId": s.bridge_id, "ok": ok, "message": "" if ok else s.error.message, "code": "" if ok else s.error.code}) + "\n")
                got += 1
                if owed[s.bridge_id] > 0:
                    owed[s.bridge_id] -= 1
                    if owed[s.bridge_id] == 0:
                        del owed[s.bridge_id]
                if not owed:
                    settled.set()

        try:
            first = await asyncio.wait_for(call.read(), timeout=10)
            if first is grpc.aio.EOF:
                return 0
            reader = asyncio.ensure_future(drain())
            for message in messages[:pause_at]:
                await queue.put(message)
            try:
                await asyncio.wait_for(settled.wait(), timeout=5)
            except TimeoutError:
                print(f"fuzz-guest: {sum(owed.values())} owed answers never arrived", file=sys.stderr)
            for message in messages[pause_at:]:
                await queue.put(message)
            await asyncio.wait_for(reader, timeout=8)
        except (TimeoutError, grpc.aio.AioRpcError):
            pass
        finally:
            await queue.put(None)
            record.close()
        print(f"fuzz-guest: sent {len(messages)} messages, got {got} settles", file=sys.stderr)
    return 0


sys.exit(asyncio.run(main()))
