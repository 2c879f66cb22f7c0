"""Every run-store call an answer waits for ends within the store wait (SPEC §16.1 item 9, [R25]).

A store that stops answering (a partitioned or stopped PostgreSQL, a row or file lock
another process holds, a stalled disk) must not hold an ``exec``, ``wait`` or RunService
answer. :class:`StoreCalls` waits for one call at most ``limit_s`` seconds and then raises
:class:`~cellblock.server.store.StoreTimeoutError`. The call itself is not abandoned (a
thread cannot be interrupted, and a PostgreSQL transaction may still commit): it goes on
in the background, and when it ends its *undo* gives back what it got (a slot, a park, a
claim), so a run the caller was told ended is never left holding a slot or parked.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import structlog

from cellblock.server.store import StoreTimeoutError

log = structlog.get_logger("cellblock.runs")

_T = TypeVar("_T")

#: ``undo(result)`` gives back what a call that outlived its wait got (its caller was told it failed);
#: ``undo(None)`` when the late call raised and ``undo_on_error`` was asked for.
Undo = Callable[[Any], Awaitable[object]]


class StoreCalls:
    """Bounds run-store calls and finishes the ones that outlive their bound.

    Args:
        limit_s: The store wait in seconds (``CELLBLOCK_STORE_CALL_MS`` / 1000).
    """

    def __init__(self, limit_s: float) -> None:
        self.limit_s = limit_s
        self._late: set[asyncio.Future[None]] = set()

    @property
    def late(self) -> int:
        """Calls that outlived their wait and are still being finished (and undone)."""
        return len(self._late)

    async def bounded(self, call: Awaitable[_T], undo: Undo | None = None, what: str = "", *, undo_on_error: bool = False, undo_on_cancel: bool = True) -> _T:
        """Awaits ``call`` at most :attr:`limit_s` seconds.

        Args:
            call: The store call (a coroutine, or a future other callers may await too).
            undo: Run with the call's result when it ends after the caller stopped waiting
                (timed out or cancelled); ``None`` when the late result needs nothing.
            what: The call's name (logs, :attr:`StoreTimeoutError.call`).
            undo_on_error: Also run ``undo(None)`` when the late call raised (whether it
                committed is then unknown: the undo must be right either way).
            undo_on_cancel: Undo also when the caller is cancelled (false: another awaiter of
                the same future takes its answer).

        Returns:
            The call's result.

        Raises:
            StoreTimeoutError: The store did not answer within :attr:`limit_s`.
            asyncio.CancelledError: The caller was cancelled (the call is finished and undone).
        """
        pending = asyncio.ensure_future(call)
        try:
            return await asyncio.wait_for(asyncio.shield(pending), self.limit_s)
        except TimeoutError:
            if pending.done() and not pending.cancelled() and pending.exception() is not None:
                raise  # the driver's own timeout (nothing committed)
            log.warning("store.call_timed_out", call=what, limit_s=self.limit_s)
            self.finish_later(pending, undo, what, undo_on_error=undo_on_error)
            raise StoreTimeoutError(what, self.limit_s) from None
        except asyncio.CancelledError:
            if undo_on_cancel:
                self.finish_later(pending, undo, what, undo_on_error=undo_on_error)
            raise

    def finish_later(self, pending: Awaitable[Any], undo: Undo | None = None, what: str = "", *, undo_on_error: bool = False) -> None:
        """Lets ``pending`` end in the background, then runs ``undo`` on its result (failures are logged).

        Args:
            pending: The call still under way.
            undo: See :meth:`bounded`.
            what: The call's name, for logs.
            undo_on_error: See :meth:`bounded`.
        """

        async def finish() -> None:
            try:
                result = await pending
            except Exception as exc:  # noqa: BLE001 - a lease then lapses and the sweep frees what is left
                log.warning("store.late_call_failed", call=what, error_class=exc.__class__.__name__, error=str(exc)[:200])
                if undo is None or not undo_on_error:
                    return
                result = None
            if undo is not None:
                try:
                    await undo(result)
                except Exception as exc:  # noqa: BLE001 - as above
                    log.warning("store.late_undo_failed", call=what, error_class=exc.__class__.__name__, error=str(exc)[:200])

        task = asyncio.ensure_future(finish())
        self._late.add(task)
        task.add_done_callback(self._late.discard)

    async def drain(self) -> None:
        """Waits until every late call has ended and been undone (tests, the service's stop)."""
        while self._late:
            await asyncio.gather(*list(self._late), return_exceptions=True)
