"""The fleet run store: PostgreSQL through asyncpg (SPEC §16.1).

asyncpg is a maintained, native asyncio driver with the binary protocol and
its own pool, so snapshot bytes travel as ``bytea`` without text encoding.
Each store method is one transaction; the record and its snapshot are written
together (SPEC §16.1 item 2). Times come from the database server's clock, so
replicas with skewed clocks agree on expiry and lease lapse.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from cellblock.server.store._base import StoreUnavailableError
from cellblock.server.store._sql import SqlRunStore, Tx

#: ``pg_advisory_xact_lock`` keys: slot accounting, and schema migrations at start.
SLOT_LOCK_KEY = 0x63656C6C0001
MIGRATION_LOCK_KEY = 0x63656C6C0002
#: Seconds to wait for the server at start before failing closed.
CONNECT_TIMEOUT_S = 10.0
_PLACEHOLDER = re.compile(r"\?")


def _numbered(sql: str) -> str:
    counter = iter(range(1, 10_000))
    return _PLACEHOLDER.sub(lambda _m: f"${next(counter)}", sql)


class _PgTx(Tx):
    def __init__(self, conn: Any) -> None:
        self._conn = conn

    async def one(self, sql: str, *args: Any) -> Sequence[Any] | None:
        row = await self._conn.fetchrow(_numbered(sql), *args)
        return None if row is None else tuple(row)

    async def all(self, sql: str, *args: Any) -> list[Sequence[Any]]:
        return [tuple(r) for r in await self._conn.fetch(_numbered(sql), *args)]

    async def run(self, sql: str, *args: Any) -> int:
        status = await self._conn.execute(_numbered(sql), *args)
        tail = str(status).rsplit(" ", 1)[-1]
        return int(tail) if tail.isdigit() else 0


class PostgresRunStore(SqlRunStore):
    """A run store in a PostgreSQL database shared by every replica.

    Args:
        dsn: A ``postgresql://`` URL (libpq form, e.g. ``postgresql:///cellblock?host=/run/postgresql``).
        cap: The suspended-run cap.
        pool_size: Most connections this replica opens.
        call_s: The store wait. The server's ``lock_timeout`` and ``statement_timeout`` are twice
            it (a statement that waits or runs longer fails and its transaction rolls back) and the
            driver's command timeout three times it, so a call that outlived the wait (``RunRegistry``
            answered without it) still ends, committed or rolled back. Migrations at start get
            :data:`CONNECT_TIMEOUT_S` more.
    """

    kind = "postgresql"
    for_update = " FOR UPDATE"

    def __init__(self, dsn: str, cap: int, pool_size: int = 8, call_s: float = 60.0) -> None:
        super().__init__(cap)
        self.dsn = dsn
        self.call_s = call_s
        self._pool_size = pool_size
        self._pool: Any = None

    async def open(self) -> None:
        import asyncpg  # noqa: PLC0415 - only deployments that name PostgreSQL need the driver

        try:
            limit_ms = str(int(self.call_s * 2000))
            self._pool = await asyncpg.create_pool(
                self.dsn, min_size=1, max_size=self._pool_size, timeout=CONNECT_TIMEOUT_S, command_timeout=self.call_s * 3,
                server_settings={"lock_timeout": limit_ms, "statement_timeout": limit_ms, "idle_in_transaction_session_timeout": limit_ms},
            )
            await self.migrate("postgresql", self._migration_tx)
        except StoreUnavailableError:
            await self.close()
            raise
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError, ValueError) as exc:
            await self.close()
            raise StoreUnavailableError(f"cannot open the PostgreSQL run store: {exc.__class__.__name__}: {exc}") from exc

    async def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Tx]:
        if self._pool is None:
            raise StoreUnavailableError("the PostgreSQL run store is not open")
        async with self._pool.acquire() as conn, conn.transaction():
            yield _PgTx(conn)

    @asynccontextmanager
    async def _migration_tx(self) -> AsyncIterator[Tx]:
        async with self.transaction() as tx:
            limit_ms = int((self.call_s * 2 + CONNECT_TIMEOUT_S) * 1000)
            await tx.run(f"SET LOCAL lock_timeout = {limit_ms}")
            await tx.run(f"SET LOCAL statement_timeout = {limit_ms}")
            # Replicas starting together apply each migration once.
            await tx.one("SELECT pg_advisory_xact_lock(?)", MIGRATION_LOCK_KEY)
            yield tx

    async def tx_now(self, tx: Tx) -> float:
        row = await tx.one("SELECT extract(epoch FROM clock_timestamp())::float8")
        assert row is not None
        return float(row[0])

    async def lock_slots(self, tx: Tx) -> None:
        await tx.one("SELECT pg_advisory_xact_lock(?)", SLOT_LOCK_KEY)
