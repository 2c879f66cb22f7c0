"""The embedded run store: one SQLite file in WAL mode (SPEC §16.1 item 1).

Uses the standard library's ``sqlite3`` on one dedicated thread rather than
``aiosqlite``: that library is the same thread-plus-queue design, and doing it
here keeps explicit control of ``BEGIN IMMEDIATE`` transactions (the store's
atomicity) without a dependency. Several processes on one host may share the
file: ``BEGIN IMMEDIATE`` serialises writers across them and WAL lets readers
proceed. ``synchronous=FULL`` makes every committed park durable, also across
power loss.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

from cellblock.server.store._base import StoreUnavailableError
from cellblock.server.store._sql import SqlRunStore, Tx

_T = TypeVar("_T")
#: Seconds a writer waits for another process's transaction before failing.
BUSY_TIMEOUT_S = 30.0


class _SqliteTx(Tx):
    def __init__(self, store: SqliteRunStore) -> None:
        self._store = store

    async def one(self, sql: str, *args: Any) -> Sequence[Any] | None:
        rows = await self.all(sql, *args)
        return rows[0] if rows else None

    async def all(self, sql: str, *args: Any) -> list[Sequence[Any]]:
        return await self._store.call(lambda c: c.execute(sql, args).fetchall())

    async def run(self, sql: str, *args: Any) -> int:
        return await self._store.call(lambda c: c.execute(sql, args).rowcount)


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
        self._lock = asyncio.Lock()

    async def call(self, fn: Callable[[sqlite3.Connection], _T]) -> _T:
        """Runs ``fn(connection)`` on the store's thread."""
        if self._conn is None or self._thread is None:
            raise StoreUnavailableError("the SQLite run store is not open")
        conn = self._conn
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn, conn)

    async def open(self) -> None:
        try:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreUnavailableError(f"cannot create the run store's directory for {self.path}: {exc}") from exc
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="cellblock-sqlite")

        def connect() -> sqlite3.Connection:
            conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                conn.close()
                raise sqlite3.OperationalError(f"journal_mode is {mode}, not wal")
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_S * 1000)}")
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
