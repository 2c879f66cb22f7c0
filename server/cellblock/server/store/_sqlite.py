"""The embedded run store: one SQLite file in WAL mode (SPEC §16.1 item 1).

Uses the standard library's ``sqlite3`` on one dedicated thread rather than
``aiosqlite``: that library is the same thread-plus-queue design, and doing it
here keeps explicit control of ``BEGIN IMMEDIATE`` transactions (the store's
atomicity) without a dependency. Every store operation runs as a whole on that
thread, ``BEGIN`` to ``COMMIT``, in one hop from the event loop (the shared SQL
of :mod:`._sql` is driven there without suspending), not one hop per statement:
a claim was five hops, each a loop wake-up on the way to a wait's reply
(bench/README.md, the resume round trip). Several processes on one host may
share the file: ``BEGIN IMMEDIATE`` serialises writers across them and WAL lets
readers proceed. ``synchronous=FULL`` makes every committed park durable, also
across power loss; a claim, a lease renewal and a slot reservation commit at
``synchronous=NORMAL`` (:data:`_PROCESS_DURABLE`): no fsync of their own, durable
across a crash of any process (the WAL is written before ``COMMIT`` returns), and
the next FULL commit (the leg's park or removal) syncs them with it. Only a crash
of the host can lose one, and that also ends every leg that relied on it (the
store is one file on one host): the run is then at its last park, as after a
replica's death (SPEC §16.1 item 6).

``secure_delete=FAST`` (:data:`_SECURE_DELETE`): SQLite builds that default to
``secure_delete=ON`` (Debian's, among others) zero every freed page in the
same transaction, so a removal wrote the snapshot's pages once more (and, while
the snapshot was inline in the run's row, a claim rewrote it and zeroed the old
pages), each page a WAL frame the next FULL commit syncs. FAST zeroes freed
content inside b-tree pages only; freed overflow pages keep their bytes until
SQLite reuses them, in a file (and a WAL, which keeps copies of every written
page until it is overwritten, whatever the setting) that only the service
reads. Measured on the exec/wait pairs (bench/README.md, "the run store's
pages").
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

from cellblock.server.store._base import Claim, Park, RenewStatus, RunRecord, SlotAnswer, StoreUnavailableError
from cellblock.server.store._sql import SqlRunStore, Tx

_T = TypeVar("_T")
#: Seconds a writer waits for another process's transaction before failing.
BUSY_TIMEOUT_S = 30.0
#: ``PRAGMA synchronous`` of every operation but those below.
_HOST_DURABLE = "FULL"
#: ``PRAGMA synchronous`` of claims, renewals and slot reservations (see the module docstring).
_PROCESS_DURABLE = "NORMAL"
#: ``PRAGMA secure_delete`` of the store's connection (see the module docstring).
_SECURE_DELETE = "FAST"


class _SqliteTx(Tx):
    """Statements of one transaction: run in place on the store's thread, else one hop each."""

    def __init__(self, store: SqliteRunStore) -> None:
        self._store = store

    async def one(self, sql: str, *args: Any) -> Sequence[Any] | None:
        rows = await self.all(sql, *args)
        return rows[0] if rows else None

    async def all(self, sql: str, *args: Any) -> list[Sequence[Any]]:
        return await self._store.call(lambda c: c.execute(sql, args).fetchall())

    async def run(self, sql: str, *args: Any) -> int:
        return await self._store.call(lambda c: c.execute(sql, args).rowcount)


def _drive(coro: Coroutine[Any, Any, _T]) -> _T:
    """Runs a coroutine that never suspends (a store operation on the store's thread) to its end."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    coro.close()
    raise RuntimeError("a SQLite store operation suspended on the store's thread")


class SqliteRunStore(SqlRunStore):
    """A run store in one SQLite file.

    Args:
        path: The database file; its directory is created when missing.
        cap: The suspended-run cap.
    """

    kind = "sqlite"

    def __init__(self, path: str, cap: int) -> None:
        super().__init__(cap)
        self.path = path
        self._conn: sqlite3.Connection | None = None
        self._thread: ThreadPoolExecutor | None = None
        self._thread_id: int | None = None
        #: Held by every transaction begun on the loop, and by every operation sent whole to the thread.
        self._lock = asyncio.Lock()

    def _on_thread(self) -> bool:
        return threading.get_ident() == self._thread_id

    async def call(self, fn: Callable[[sqlite3.Connection], _T]) -> _T:
        """Runs ``fn(connection)`` on the store's thread (in place when already there)."""
        if self._conn is None or self._thread is None:
            raise StoreUnavailableError("the SQLite run store is not open")
        conn = self._conn
        if self._on_thread():
            return fn(conn)
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn, conn)

    async def _whole(self, operation: Callable[[], Coroutine[Any, Any, _T]], synchronous: str = _HOST_DURABLE) -> _T:
        """Runs one store operation (a :class:`SqlRunStore` method: one transaction) wholly on the store's thread.

        A caller cancelled meanwhile stops waiting; the operation still ends on the thread
        (committed or rolled back as a whole), as one cancelled just after its ``COMMIT`` did
        (a claim so committed is given back by :meth:`RunRegistry.claim`).

        Args:
            operation: Makes the operation's coroutine (it must not suspend).
            synchronous: The ``PRAGMA synchronous`` its ``COMMIT`` runs at.
        """
        if self._conn is None or self._thread is None:
            raise StoreUnavailableError("the SQLite run store is not open")
        conn = self._conn

        def run() -> _T:
            if synchronous == _HOST_DURABLE:
                return _drive(operation())
            conn.execute(f"PRAGMA synchronous={synchronous}")
            try:
                return _drive(operation())
            finally:
                conn.execute(f"PRAGMA synchronous={_HOST_DURABLE}")

        async with self._lock:
            return await asyncio.get_running_loop().run_in_executor(self._thread, run)

    async def open(self) -> None:
        try:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreUnavailableError(f"cannot create the run store's directory for {self.path}: {exc}") from exc
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="cellblock-sqlite")

        def connect() -> sqlite3.Connection:
            self._thread_id = threading.get_ident()
            conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                conn.close()
                raise sqlite3.OperationalError(f"journal_mode is {mode}, not wal")
            conn.execute(f"PRAGMA synchronous={_HOST_DURABLE}")
            conn.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_S * 1000)}")
            conn.execute(f"PRAGMA secure_delete={_SECURE_DELETE}")
            return conn

        try:
            self._conn = await asyncio.get_running_loop().run_in_executor(self._thread, connect)
            await self.migrate("sqlite", self.transaction)
        except sqlite3.Error as exc:
            await self.close()
            raise StoreUnavailableError(f"cannot open the SQLite run store {self.path}: {exc}") from exc
        except StoreUnavailableError:
            await self.close()
            raise

    async def close(self) -> None:
        conn, thread = self._conn, self._thread
        self._conn = self._thread = None
        if conn is not None and thread is not None:
            await asyncio.get_running_loop().run_in_executor(thread, conn.close)
        if thread is not None:
            thread.shutdown(wait=True)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Tx]:
        if self._on_thread():
            # Inside an operation sent whole to the thread (_whole holds the lock).
            conn = self._conn
            assert conn is not None
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield _SqliteTx(self)
            except BaseException:
                conn.rollback()
                raise
            try:
                conn.execute("COMMIT")
            except BaseException:
                conn.rollback()
                raise
            return
        async with self._lock:
            try:
                # Inside the try: a caller cancelled while BEGIN runs on the store's
                # thread would otherwise leave the connection in a transaction, and
                # every later BEGIN would fail (rollback without one is a no-op).
                await self.call(lambda c: c.execute("BEGIN IMMEDIATE"))
                yield _SqliteTx(self)
            except BaseException:
                await self.call(lambda c: c.rollback())
                raise
            try:
                await self.call(lambda c: c.execute("COMMIT"))
            except BaseException:
                await self.call(lambda c: c.rollback())
                raise

    async def tx_now(self, tx: Tx) -> float:
        # One host shares the file, so its wall clock is the store's clock.
        return time.time()

    async def lock_slots(self, tx: Tx) -> None:
        # BEGIN IMMEDIATE already holds the database's write lock.
        return None

    async def backend_check(self, tx: Tx) -> list[str]:
        rows = await tx.all("PRAGMA integrity_check")
        return [] if [r[0] for r in rows] == ["ok"] else [f"sqlite integrity_check: {r[0]}" for r in rows]

    # Every operation of the run store, each one hop to the store's thread.
    async def now(self) -> float:
        return await self._whole(lambda: SqlRunStore.now(self))

    async def reserve_slot(self, run_id: str, session_id: str, agent_run_id: str, created_at: float, lease_token: str, lease_seconds: float) -> SlotAnswer:
        return await self._whole(lambda: SqlRunStore.reserve_slot(self, run_id, session_id, agent_run_id, created_at, lease_token, lease_seconds), _PROCESS_DURABLE)

    async def park(self, park: Park, lease_token: str) -> float | None:
        return await self._whole(lambda: SqlRunStore.park(self, park, lease_token))

    async def park_with_slot(self, park: Park) -> float | SlotAnswer | None:
        return await self._whole(lambda: SqlRunStore.park_with_slot(self, park))

    async def claim(self, run_id: str, session_id: str, agent_run_id: str, lease_token: str, lease_seconds: float) -> Claim:
        return await self._whole(lambda: SqlRunStore.claim(self, run_id, session_id, agent_run_id, lease_token, lease_seconds), _PROCESS_DURABLE)

    async def renew(self, run_id: str, lease_token: str, lease_seconds: float) -> RenewStatus:
        return await self._whole(lambda: SqlRunStore.renew(self, run_id, lease_token, lease_seconds), _PROCESS_DURABLE)

    async def release(self, run_id: str, lease_token: str, body: bytes | None = None) -> None:
        await self._whole(lambda: SqlRunStore.release(self, run_id, lease_token, body))

    async def remove(self, run_id: str, lease_token: str | None) -> bool:
        return await self._whole(lambda: SqlRunStore.remove(self, run_id, lease_token))

    async def cancel(self, run_id: str, session_id: str, agent_run_id: str, until: float) -> None:
        await self._whole(lambda: SqlRunStore.cancel(self, run_id, session_id, agent_run_id, until))

    async def sweep(self) -> list[RunRecord]:
        return await self._whole(lambda: SqlRunStore.sweep(self))

    async def sweep_and_count(self) -> tuple[list[RunRecord], tuple[int, int]]:
        async def both() -> tuple[list[RunRecord], tuple[int, int]]:
            return await SqlRunStore.sweep(self), await SqlRunStore.counts(self)

        return await self._whole(both)

    async def get(self, run_id: str) -> RunRecord | None:
        return await self._whole(lambda: SqlRunStore.get(self, run_id))

    async def list_scope(self, session_id: str, agent_run_id: str) -> list[RunRecord]:
        return await self._whole(lambda: SqlRunStore.list_scope(self, session_id, agent_run_id))

    async def counts(self) -> tuple[int, int]:
        return await self._whole(lambda: SqlRunStore.counts(self))

    async def check_integrity(self) -> list[str]:
        return await self._whole(lambda: SqlRunStore.check_integrity(self))
