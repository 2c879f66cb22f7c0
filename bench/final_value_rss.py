"""How much a large final value grows the service's memory (issue 11 item 4).

For each size, a fresh service process (``python -m cellblock.server``, Docker cells, no warm
pool) runs one exec that returns a string of that many bytes from a cell with a large memory
limit. Prints the process's RSS before the exec, its peak (``VmHWM``) during it and its RSS
after, and the exec's outcome. ``BENCH_VALUE_MB`` lists the sizes (default ``10,60``);
``BENCH_MAX_OUTPUT_BYTES`` sets the exec's ``maxOutputBytes`` (default: the deployment's, 64 KiB).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.noisy_neighbour import _free_port, _ready, service_env
from cellblock.client import CellblockClient, LimitOverrides, Scope, Tool

IMAGE = os.environ.get("CELLBLOCK_IMAGE", "cellblock-cell:dev")
SIZES_MB = [int(s) for s in os.environ.get("BENCH_VALUE_MB", "10,60").split(",")]
MAX_OUTPUT_BYTES = int(os.environ["BENCH_MAX_OUTPUT_BYTES"]) if os.environ.get("BENCH_MAX_OUTPUT_BYTES") else None
MIB = 1024 * 1024


def status_mib(pid: int, field: str) -> float:
    """A ``/proc/<pid>/status`` memory field (``VmRSS``, ``VmHWM``), MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


async def one(size_mb: int) -> str:
    with tempfile.TemporaryDirectory(prefix="cellblock-bigvalue-") as sockets:
        address = f"127.0.0.1:{_free_port()}"
        env = service_env(address, sockets, IMAGE, timeout_ms=30000, CELLBLOCK_WARM_POOL="0")
        proc = subprocess.Popen([sys.executable, "-m", "cellblock.server"], env=env, stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL)  # noqa: S603
        try:
            await _ready(address, proc)
            async with await CellblockClient.connect(address) as client:
                scope = Scope("bigvalue", "bench")
                await client.put_catalog(scope, [Tool(source="host", owner="core", name="noop")])
                await client.exec(scope, tool_call_id="warm", code="return 1", handlers={})
                before = status_mib(proc.pid, "VmRSS")
                # Reset the peak to the current RSS (Linux: writing 5 to clear_refs).
                Path(f"/proc/{proc.pid}/clear_refs").write_text("5")
                code = f'return "x".repeat({size_mb} * 1024 * 1024);'
                result = await client.exec(scope, tool_call_id="big", code=code, handlers={}, limits=LimitOverrides(memory_limit_bytes=1024 * MIB, timeout_ms=30000, max_output_bytes=MAX_OUTPUT_BYTES))
                peak = status_mib(proc.pid, "VmHWM")
                await asyncio.sleep(1)
                after = status_mib(proc.pid, "VmRSS")
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
    outcome = result.status + (f"/{result.code}" if result.code else "")
    return f"{size_mb:>4} MB value: RSS before {before:6.0f} MiB, peak {peak:6.0f} MiB (+{peak - before:.0f}), after {after:6.0f} MiB (+{after - before:.0f}); {outcome}"


async def main() -> None:
    for size in SIZES_MB:
        print(await one(size), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
