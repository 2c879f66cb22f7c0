"""The floor of a nested call: a raw ``grpc.aio`` bidi ping-pong over the same two hops.

A nested call goes cell → (unix socket) → service → (TCP) → runtime and back.
Here the same topology carries a 32-byte payload and nothing else: the
"service" is a grpc.aio server in the bench process with one unix-socket
stream from the "cell" (a separate Python process, like the cell's agent) and
one TCP stream from the "runtime" (a grpc.aio client in the bench process,
like the cellblock client); each side forwards through a queue, as the real
service does. The cell process times each round trip.

``python -m bench.pingpong cell <socket> <rounds>`` is the cell end.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc

_CELL = "/bench.PingPong/Cell"
_RUNTIME = "/bench.PingPong/Runtime"
PAYLOAD = b"x" * 32


class _Hub:
    def __init__(self) -> None:
        self.to_runtime: asyncio.Queue[bytes] = asyncio.Queue()
        self.to_cell: asyncio.Queue[bytes] = asyncio.Queue()

    async def cell(self, requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
        async for msg in _forward(requests, self.to_runtime, self.to_cell):
            yield msg

    async def runtime(self, requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
        async for msg in _forward(requests, self.to_cell, self.to_runtime):
            yield msg


async def _forward(requests: AsyncIterator[bytes], inbound: asyncio.Queue[bytes], outbound: asyncio.Queue[bytes]) -> AsyncIterator[bytes]:
    """One side of the service: what arrives goes to ``inbound``; ``outbound`` goes back out."""

    async def pump() -> None:
        async for msg in requests:
            await inbound.put(msg)

    task = asyncio.ensure_future(pump())
    try:
        while True:
            yield await outbound.get()
    finally:
        task.cancel()


async def measure(rounds: int) -> list[float]:
    """Runs the two-hop ping-pong; returns ``rounds`` round-trip times in ms."""
    hub = _Hub()
    handler = grpc.method_handlers_generic_handler(
        "bench.PingPong",
        {"Cell": grpc.stream_stream_rpc_method_handler(hub.cell), "Runtime": grpc.stream_stream_rpc_method_handler(hub.runtime)},
    )
    with tempfile.TemporaryDirectory(prefix="bench-pingpong-") as d:
        sock = os.path.join(d, "bridge.sock")
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((handler,))
        server.add_insecure_port(f"unix:{sock}")
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                call = channel.stream_stream(_RUNTIME)()

                async def echo() -> None:
                    async for msg in call:
                        await call.write(msg)

                echoing = asyncio.ensure_future(echo())
                proc = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "bench.pingpong", "cell", sock, str(rounds), stdout=subprocess.PIPE, env=dict(os.environ)
                )
                out, _ = await proc.communicate()
                echoing.cancel()
                call.cancel()
        finally:
            await server.stop(0)
    samples: list[float] = json.loads(out)
    return samples


async def _cell(sock: str, rounds: int) -> list[float]:
    async with grpc.aio.insecure_channel(f"unix:{sock}") as channel:
        call = channel.stream_stream(_CELL)()
        for _ in range(20):  # warm-up
            await call.write(PAYLOAD)
            await call.read()
        out = []
        for _ in range(rounds):
            t = time.perf_counter()
            await call.write(PAYLOAD)
            await call.read()
            out.append((time.perf_counter() - t) * 1000)
        call.cancel()
        return out


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "cell":
        print(json.dumps(asyncio.run(_cell(sys.argv[2], int(sys.argv[3])))))
    else:
        samples = asyncio.run(measure(200))
        print(f"two-hop ping-pong p50 {sorted(samples)[len(samples) // 2]:.3f} ms")
