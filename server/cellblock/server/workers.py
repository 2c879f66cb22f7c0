"""A bounded pool of worker processes for CPU-heavy steps (SPEC §2.3, §14.2).

Every RPC of every scope shares one asyncio event loop, so a step whose cost grows
with a tenant's input must not run on it: source preparation costs about 5 s per MB
of program, and schema processing grows with the schema. Such steps run here, in a
small pool of worker processes, each call with its own time budget; a call that
overruns has its worker killed and replaced, and fails with :class:`WorkBudgetExceeded`
so that the caller fails that leg (or that ``PutCatalog``), never the service.

Processes, not threads: the steps are pure Python and tree-sitter calls that hold
the GIL, so a worker thread still stalls the loop (measured: preparing a 1 MB program
in a thread held the loop for 0.53 s at a time). The pool is ``pebble.ProcessPool``
(maintained, kills a worker whose task overruns its timeout, which
``concurrent.futures`` cannot), started with ``spawn`` so workers never inherit the
gRPC threads of the service process. As with any ``spawn`` pool, a script that starts
the service must guard its entry point with ``if __name__ == "__main__":``.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import multiprocessing
import os
import threading
from collections.abc import AsyncIterator, Callable, Hashable
from concurrent.futures import CancelledError as FutureCancelledError
from concurrent.futures import TimeoutError as FutureTimeoutError
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any, TypeVar

import pebble
import structlog

from cellblock.server.limits import SMALL_JOB_CHARS
from cellblock.server.memory import resident_bytes, trim_free_memory, tune_allocator

log = structlog.get_logger("cellblock.workers")

T = TypeVar("T")

#: Worker processes in the pool (``CELLBLOCK_CPU_WORKERS``, 1 … 64). Default: half the cores, at least 1, at most 4.
DEFAULT_WORKERS = max(1, min(4, (os.cpu_count() or 2) // 2))

#: A worker whose resident memory stays above this after a trim is retired (its lane's pool is replaced).
WORKER_RSS_LIMIT_BYTES = 320 << 20


class WorkBudgetExceeded(Exception):  # noqa: N818 - a condition, not a fault
    """A worker call did not finish within its time budget (the worker was replaced)."""


class WorkerBusy(WorkBudgetExceeded):
    """No worker started the call within its wait bound (``CpuPool.run``'s ``wait_s``): other calls held the lane.

    A :class:`WorkBudgetExceeded` for callers that bound the whole call by one budget; a caller
    that passes ``wait_s`` tells it apart (the service was busy, the input was not too costly).
    """


class WorkerFailed(Exception):  # noqa: N818
    """A worker process died or could not run the call (memory, a crash)."""


#: The key of a lane's free workers among the tenants' turns (``CpuPool._gate``).
_WORKERS = object()


@dataclass
class _Turns:
    """One tenant's turns in one lane, or the lane's free workers: ``slots`` counts the calls holding one, ``users`` those waiting or holding."""

    slots: asyncio.Semaphore
    users: int = 0


def _measured(fn: Callable[..., T], args: tuple[Any, ...], large: bool) -> tuple[T, bool]:
    """Runs ``fn(*args)`` in the worker; returns its result and whether the worker holds too much memory to keep.

    After a call whose input was large, or when the worker's RSS is past
    :data:`WORKER_RSS_LIMIT_BYTES`, the worker hands its free heap pages back
    (``malloc_trim``); a worker still past the limit asks to be retired. A small call on a
    worker within the limit costs one read of ``/proc/self/statm`` (microseconds).
    """
    result = fn(*args)
    if large or resident_bytes() > WORKER_RSS_LIMIT_BYTES:
        trim_free_memory()
        return result, resident_bytes() > WORKER_RSS_LIMIT_BYTES
    return result, False


def _let_go(pool: pebble.ProcessPool) -> None:
    """Sends ``pool`` a no-op call so that its scheduler thread lets go of the last one.

    pebble's scheduler loop keeps the last call it scheduled in a local variable until the next
    arrives, and with it that call's arguments and result: after a large registration the
    service kept its 33 MB request and the decoded catalog (hundreds of MiB) after the catalog
    was deleted. A large-lane call is followed by this one (a worker's millisecond).
    """
    with contextlib.suppress(RuntimeError):  # the pool was closed meanwhile: its threads end
        pool.schedule(int)


class CpuPool:
    """A bounded pool of worker processes with a time budget per call, in two lanes, shared fairly by scopes.

    Calls whose input is at most :data:`SMALL_JOB_CHARS` use the small lane (one worker:
    such a call takes milliseconds), larger ones the large lane; a tenant flooding the
    large lane delays only other large inputs.

    Each lane gives a tenant (a scope) at most :meth:`share` calls in the lane's queue at
    once; the tenant's further calls wait for one of them to end, so another tenant's call
    queues behind at most that many of its calls, never behind its whole backlog (SPEC §2.3).

    Args:
        workers: Worker processes of the large lane (calls beyond them queue; queueing
            counts against the call's budget unless the call has a wait bound of its own).
    """

    def __init__(self, workers: int = DEFAULT_WORKERS) -> None:
        """Creates the pool; worker processes start on first use."""
        self.workers = max(1, workers)
        self._pools: dict[bool, pebble.ProcessPool] = {}
        self._lock = threading.Lock()
        #: Per lane and tenant, its turns (a semaphore of :meth:`share` calls) and the calls using it;
        #: per lane (tenant ``_WORKERS``), its free workers (a call holds one while it runs).
        self._turns: dict[tuple[bool, Hashable], _Turns] = {}

    def share(self, small: bool) -> int:
        """Calls one tenant may have in a lane's queue at once: half the lane's workers, at least one."""
        return 1 if small else max(1, self.workers // 2)

    @contextlib.asynccontextmanager
    async def _gate(self, small: bool, tenant: Hashable, budget_s: float, busy: type[WorkBudgetExceeded]) -> AsyncIterator[None]:
        """Holds one of ``tenant``'s turns in the lane (or, for ``_WORKERS``, one of its free workers); waits at most ``budget_s`` for it (else raises ``busy``).

        The lane's calls queue for a worker here, never in pebble's queue: a call cancelled there
        is still sent to a worker, which pebble then kills and replaces (a second of ``spawn``).
        """
        if budget_s <= 0:
            raise busy
        key = (small, tenant)
        turns = self._turns.get(key)
        if turns is None:
            capacity = (1 if small else self.workers) if tenant is _WORKERS else self.share(small)
            turns = self._turns[key] = _Turns(asyncio.Semaphore(capacity))
        turns.users += 1
        try:
            try:
                await asyncio.wait_for(turns.slots.acquire(), timeout=budget_s)
            except TimeoutError:
                raise busy from None
            try:
                yield
            finally:
                turns.slots.release()
        finally:
            turns.users -= 1
            if turns.users == 0:
                del self._turns[key]  # no tenant leaves a trace once its calls ended (nor a loop its semaphore)

    def _ensure(self, small: bool) -> pebble.ProcessPool:
        with self._lock:
            pool = self._pools.get(small)
            if pool is None or not pool.active:
                pool = pebble.ProcessPool(max_workers=1 if small else self.workers, initializer=tune_allocator, context=multiprocessing.get_context("spawn"))
                self._pools[small] = pool
            return pool

    async def run(self, fn: Callable[..., T], *args: Any, budget_s: float, size: int = 0, tenant: Hashable = None, wait_s: float | None = None) -> T:
        """Runs ``fn(*args)`` in a worker process.

        Args:
            fn: A module-level function (it and its arguments and result must pickle).
            *args: Its arguments.
            budget_s: Seconds the call may take: queueing included (waiting for the tenant's turn
                too) when ``wait_s`` is ``None``, else from the moment a worker starts it.
            size: The input's size in characters; it picks the lane.
            tenant: Whose call it is (a scope's ``(session_id, agent_run_id)``); ``None`` is one
                tenant of its own, for calls no scope makes.
            wait_s: Seconds the call may wait for its tenant's turn and a worker, on top of
                ``budget_s``; ``None``: one budget for both.

        Returns:
            What ``fn`` returned.

        Raises:
            WorkerBusy: ``wait_s`` ran out before a worker started the call.
            WorkBudgetExceeded: The budget ran out (a running call's worker is killed).
            WorkerFailed: The worker process died.
            Exception: What ``fn`` raised, re-raised here.
        """
        if budget_s <= 0:
            raise WorkBudgetExceeded
        small = size <= SMALL_JOB_CHARS
        loop = asyncio.get_running_loop()
        one_budget = wait_s is None
        stop_waiting = loop.time() + (budget_s if wait_s is None else wait_s)
        busy = WorkBudgetExceeded if one_budget else WorkerBusy
        async with self._gate(small, tenant, stop_waiting - loop.time(), busy), self._gate(small, _WORKERS, stop_waiting - loop.time(), busy):
            # A worker is free: pebble starts the call now and counts ``timeout`` from then.
            pool = self._ensure(small)
            result, retire = await self._run(pool, fn, args, not small, stop_waiting - loop.time() if one_budget else budget_s)
            if retire:
                self._retire(small, pool)
            elif not small:
                _let_go(pool)
            return result

    def _retire(self, small: bool, pool: pebble.ProcessPool) -> None:
        """Replaces a lane's pool whose worker kept too much memory with a fresh one (its workers start now).

        The old pool is closed, not stopped: calls running on its other workers (other
        tenants') finish there, then its processes exit.
        """
        with self._lock:
            if self._pools.get(small) is not pool:
                return  # already replaced
            del self._pools[small]
        log.info("worker.retired", lane="small" if small else "large", limit_mib=WORKER_RSS_LIMIT_BYTES >> 20)
        pool.close()  # type: ignore[no-untyped-call]
        threading.Thread(target=pool.join, name="cpu-pool-retire", daemon=True).start()
        self._ensure(small).schedule(int)  # the fresh workers spawn now, not inside the next call's budget

    async def _run(self, pool: pebble.ProcessPool, fn: Callable[..., T], args: tuple[Any, ...], large: bool, budget_s: float) -> tuple[T, bool]:
        if budget_s <= 0:
            raise WorkBudgetExceeded
        future = pool.schedule(_measured, args=(fn, args, large), timeout=budget_s)
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), timeout=budget_s + 0.5)
        except (FutureTimeoutError, TimeoutError):
            future.cancel()  # type: ignore[no-untyped-call]  # pebble stops the worker running a cancelled task
            raise WorkBudgetExceeded from None
        except FutureCancelledError:
            raise WorkBudgetExceeded from None
        except pebble.ProcessExpired as exc:
            log.error("worker.expired", exitcode=exc.exitcode)
            raise WorkerFailed(f"worker process exited with {exc.exitcode}") from None
        except BrokenProcessPool as exc:
            log.error("worker.pool_broken", error=str(exc)[:200])
            self.close()  # the next call starts a fresh pool
            raise WorkerFailed("the worker pool broke") from None
        except asyncio.CancelledError:
            future.cancel()  # type: ignore[no-untyped-call]
            raise

    def close(self) -> None:
        """Stops the workers (running calls are abandoned)."""
        with self._lock:
            pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            pool.stop()  # type: ignore[no-untyped-call]
            pool.join(timeout=5)


_default: CpuPool | None = None
_default_lock = threading.Lock()


def cpu_pool() -> CpuPool:
    """The process-wide pool (created on first use, sized by ``CELLBLOCK_CPU_WORKERS``)."""
    global _default  # noqa: PLW0603 - one pool per process, shared by every service in it
    with _default_lock:
        if _default is None:
            raw = os.environ.get("CELLBLOCK_CPU_WORKERS", "")
            workers = int(raw) if raw.isdigit() and 1 <= int(raw) <= 64 else DEFAULT_WORKERS
            _default = CpuPool(workers)
            atexit.register(_default.close)
        return _default
