"""A scripted guest agent for tests: it follows its program's ``SCRIPT:`` comment.

It attaches, takes its program, then does what the comment says, without running it.

It stands in for a cell whose engine failed in a way a real QuickJS program cannot be made to
fail on purpose (an engine trap, memory exhaustion reported by the guest, a crash with an exit
code), so the host's mapping of each failure (SPEC §11.1-§11.3) can be tested without Docker.
The bridge, the leg and the mapping under test are the real ones.

Scripts (one per program, in a comment such as ``// SCRIPT:fail:ENGINE_TRAP``):

* ``exit:<n>``: exit with code ``n`` without ending the leg.
* ``fail:<KIND>``: end the leg with ``Failed(kind=FAILURE_KIND_<KIND>)``; the message is a JSON
  string literal for the kinds that carry guest text.
* ``silent``: send nothing after ``Start`` (the host's watchdog must end the leg).
* ``garbage``: send a message the host does not accept after ``Start`` (a second ``hello``).
* ``forge:PROTOCOL``: send a request with a malformed bridge id (P02) and return the host's answer.
* ``forge:OUTPUT``: send output entries that are JSON but no ``text``/``json`` entry, then the P02
  request, and return the host's answer.
* ``forge:REFUSAL``: send a request refused by the guest with a refusal kind the host does not
  know, then the P02 request, and return the host's answer to the second.
* ``forge:PENDING``: send two ``callValue`` requests at once, past ``maxPendingToolCalls: 1`` (a guest
  that skipped its own count), and return the host's answer to the second (B24).

A forged leg completes with ``{"bridgeId": ..., "error": ...}``: the first ``Settle`` the host sent.
"""

import asyncio
import json
import os
import re

import grpc

from cellblock.bridge.v1 import bridge_service_pb2 as pb
from cellblock.bridge.v1 import bridge_service_pb2_grpc as pb_grpc

_SCRIPT = re.compile(r"SCRIPT:([a-z]+)(?::([A-Z_0-9]+))?")
_GUEST_TEXT = {"GUEST_ERROR", "BRIDGE_REJECTION", "SYNTAX", "MEMORY"}


def _forged(kind: str) -> list[pb.GuestRequest]:
    if kind == "PROTOCOL":
        return [pb.GuestRequest(bridge_id="bridge:call:x", method="call", args_json="[]")]
    if kind == "REFUSAL":
        # A refusal kind this host does not know, then a P02 whose answer shows the leg carried on.
        return [pb.GuestRequest(bridge_id="bridge:call:1", method="call", args_json="[]", refusal=9), pb.GuestRequest(bridge_id="bridge:call:x", method="call", args_json="[]")]
    args = json.dumps(["client:app:noop", {}])
    return [pb.GuestRequest(bridge_id=f"bridge:callValue:{n}", method="callValue", args_json=args) for n in (1, 2)]


def _failed(kind: str) -> pb.AttachRequest:
    text = "3:unexpected token" if kind == "SYNTAX" else f"scripted {kind.lower()}"
    message = json.dumps(text) if kind in _GUEST_TEXT else text
    failed = pb.Failed(kind=pb.FailureKind.Value(f"FAILURE_KIND_{kind}"), message=message, rejection_bridge_id="bridge:call:1" if kind == "BRIDGE_REJECTION" else "")
    return pb.AttachRequest(end=pb.LegEnd(failed=failed))


async def main() -> None:
    async with grpc.aio.insecure_channel("unix:" + os.environ["CELLBLOCK_BRIDGE_SOCKET"]) as channel:
        queue: asyncio.Queue[pb.AttachRequest] = asyncio.Queue()
        await queue.put(pb.AttachRequest(hello=pb.Hello(cell_token=os.environ["CELLBLOCK_CELL_TOKEN"], engine_build_id="scripted")))

        async def requests():  # type: ignore[no-untyped-def]
            while True:
                yield await queue.get()

        call = pb_grpc.BridgeServiceStub(channel).Attach(requests())
        start = (await call.read()).start
        match = _SCRIPT.search(start.source)
        action, arg = (match.group(1), match.group(2)) if match else ("exit", "0")
        if action == "exit":
            os._exit(int(arg or "0"))
        if action == "fail":
            await queue.put(_failed(arg or "GUEST_ERROR"))
        elif action == "garbage":
            await queue.put(pb.AttachRequest(hello=pb.Hello(cell_token="again")))
        elif action == "forge":
            if arg == "OUTPUT":
                # Output entries that are JSON but no text/json entry; then the P02 request.
                for entry in ("5", "[1]", '{"type": "text", "text": 1}', '{"type": "json"}', '{"type": "truncated", "truncated": true}'):
                    await queue.put(pb.AttachRequest(output=pb.GuestOutput(entry_json=entry)))
            for request in _forged("PROTOCOL" if arg in (None, "OUTPUT") else arg):
                await queue.put(pb.AttachRequest(request=request))
            while True:
                reply = await call.read()
                if reply.WhichOneof("message") == "settle":
                    break
            value = {"bridgeId": reply.settle.bridge_id, "error": reply.settle.error.message}
            await queue.put(pb.AttachRequest(end=pb.LegEnd(completed=pb.Completed(value_json=json.dumps(value)))))
        # Stay attached until the host ends the leg and removes the cell.
        await asyncio.sleep(3600)


if __name__ == "__main__":
    asyncio.run(main())
