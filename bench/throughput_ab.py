"""``python -m bench.throughput_ab A B [ROUNDS]``: the 16-client ``leg`` throughput of two cell images or create options, interleaved.

Not part of ``make bench``. A and B each name a cell image, optionally followed by
``+option=JSON`` parts that override the Docker executor's create options on that
side only (``cellblock-cell:dev+network_disabled=false`` measures the image with
one option as it was before, beside ``cellblock-cell:dev``). Each round runs, in one process: the bench's own
``CELLBLOCK_CELL_REUSE=leg`` throughput rows (cold, then steady;
:func:`bench.exec_latency._cellblock_throughput`) with a service on IMAGE_A,
the same with IMAGE_B, then llm-sandbox's and bare ``docker run``'s rows
(:func:`bench.exec_latency._docker_throughput`). Beside each row it prints the
CPU spent per run (ms) by the cells' containers (the ``docker`` cpuacct
cgroup), dockerd, containerd, this process (service and clients), the
service's worker processes, and the rest of the machine (shims, runc, the
kernel, and any other work on it), and the 1-minute load average: the rates
move with the load, so read the pairs, not single rows.

Needs cgroup v1 with ``/sys/fs/cgroup/cpuacct/docker`` (Docker's cgroupfs
layout, as on the bench machine).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from bench import baselines
from bench import exec_latency as el
from bench._report import Report
from cellblock.server.app import Service
from cellblock.server.cells import DockerExecutor

_HZ = os.sysconf("SC_CLK_TCK")
_CELLS = "/sys/fs/cgroup/cpuacct/docker/cpuacct.usage"


def _pid(name: str) -> int:
    return int(subprocess.check_output(["pgrep", "-x", name]).split()[0])


def _proc_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _HZ


def _children_s() -> float:
    total = 0.0
    for tid in os.listdir(f"/proc/{os.getpid()}/task"):
        try:
            with open(f"/proc/{os.getpid()}/task/{tid}/children") as f:
                kids = f.read().split()
        except OSError:
            continue
        for kid in kids:
            try:
                total += _proc_s(int(kid))
            except OSError:
                pass
    return total


def _cpu() -> dict[str, float]:
    """CPU seconds so far by part, and the wall clock."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    with open(_CELLS) as f:
        cells = int(f.read()) / 1e9
    own = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "total": (sum(ticks) - ticks[3] - ticks[4]) / _HZ,
        "cells": cells,
        "dockerd": _proc_s(_pid("dockerd")),
        "containerd": _proc_s(_pid("containerd")),
        "service": own.ru_utime + own.ru_stime,
        "workers": _children_s(),
        "wall": time.perf_counter(),
    }


async def _row(name: str, runs: int, measure: Callable[[dict[str, float]], Awaitable[None]]) -> None:
    rates: dict[str, float] = {}
    before = _cpu()
    await measure(rates)
    after = _cpu()
    d = {k: after[k] - before[k] for k in before}
    rest = d["total"] - sum(d[k] for k in ("cells", "dockerd", "containerd", "service", "workers"))
    per = {k: f"{1000 * v / runs:.0f}" for k, v in {**d, "rest": rest}.items()}
    shown = " / ".join(f"{v:.2f}" for v in rates.values())
    with open("/proc/loadavg") as f:
        load = f.read().split()[0]
    print(
        f"{name:44s} cold/steady {shown:12s} runs/s | CPU ms per run: cells {per['cells']}, dockerd {per['dockerd']}, containerd {per['containerd']}, "
        f"service+clients {per['service']}, workers {per['workers']}, rest {per['rest']} (all {per['total']}) | load {load}",
        flush=True,
    )


def _side(text: str) -> tuple[str, dict[str, Any]]:
    """``IMAGE+option=JSON+...`` → the image and the create options it overrides."""
    image, *parts = text.split("+")
    overrides: dict[str, Any] = {}
    for part in parts:
        key, _, value = part.partition("=")
        overrides[key] = json.loads(value)
    return image, overrides


@contextlib.contextmanager
def _create_options(overrides: dict[str, Any]) -> Iterator[None]:
    """Within the block, every cell the Docker executor creates takes ``overrides`` over its options."""
    module = sys.modules[DockerExecutor.__module__]
    original = module.container_options

    def patched(*args: Any, **kwargs: Any) -> dict[str, Any]:
        return {**original(*args, **kwargs), **overrides}

    module.container_options = patched
    try:
        yield
    finally:
        module.container_options = original


async def main(sides: list[str], rounds: int) -> None:
    """Runs ``rounds`` rounds of the rows for each side, then the two Docker-per-run rows."""
    baselines.ensure_node_image()
    report = Report()
    # Every measured and warm-up run of one row (cellblock: cold, warm-up, steady; Docker rows: cold, warm-up, steady).
    cell_runs = el.CLIENTS * (el.COLD_RUNS + 1 + el.STEADY_RUNS)
    docker_runs = el.CLIENTS * (1 + 1 + el.DOCKER_STEADY_RUNS)
    with tempfile.TemporaryDirectory(prefix="bench-ab-") as sockets:
        for _ in range(rounds):
            for side in sides:
                image, overrides = _side(side)
                baselines.IMAGE = image
                with _create_options(overrides):
                    service = await el._service(sockets, warm_pool=2)
                    try:

                        async def leg(rates: dict[str, float], service: Service = service) -> None:
                            await el._cellblock_throughput(service, report, rates, "leg")

                        await _row(f"cellblock leg, {side}", cell_runs, leg)
                    finally:
                        await service.stop()
            await _row("llm-sandbox", docker_runs, lambda rates: el._docker_throughput(report, rates, "llm-sandbox", "llm-sandbox", baselines.llm_sandbox_run))
            await _row("bare docker run --rm", docker_runs, lambda rates: el._docker_throughput(report, rates, "docker", "bare docker run", baselines.docker_run_baseline))


if __name__ == "__main__":
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    from bench.__main__ import _quiet

    _quiet()
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    asyncio.run(main(sys.argv[1:3], int(sys.argv[3]) if len(sys.argv) > 3 else 2))
