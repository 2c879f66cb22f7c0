"""The loop monitor counts what holds the loop, not what the machine's load costs (issue 11 item 1)."""

from __future__ import annotations

import asyncio
import time

import pytest

from cellblock.server.telemetry import LoopMonitor


def _spin(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


@pytest.mark.asyncio(loop_scope="function")
async def test_a_callback_computing_on_the_loop_is_a_hold() -> None:
    monitor = LoopMonitor()
    monitor.start()
    try:
        await asyncio.sleep(0.05)
        monitor.reset()
        _spin(0.15)  # 150 ms of CPU on the loop's thread
        await asyncio.sleep(0.05)
    finally:
        monitor.stop()
    assert monitor.worst_s >= 0.1, monitor.worst_s
    assert monitor.worst_lateness_s >= monitor.worst_s


@pytest.mark.asyncio(loop_scope="function")
async def test_a_thread_that_is_not_scheduled_is_no_hold() -> None:
    # time.sleep blocks the loop's thread without using CPU, as an OS that does not schedule
    # the process would: the wall lateness is large, the hold is not.
    monitor = LoopMonitor()
    monitor.start()
    try:
        await asyncio.sleep(0.05)
        monitor.reset()
        time.sleep(0.2)  # noqa: ASYNC251 - the point of the test
        await asyncio.sleep(0.05)
    finally:
        monitor.stop()
    assert monitor.worst_lateness_s >= 0.15, monitor.worst_lateness_s
    assert monitor.worst_s < 0.05, monitor.worst_s
