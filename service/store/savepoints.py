"""Transactions on the driver's connection: a savepoint per message under one fixed name, the
batch's transaction, and bookkeeping transactions."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from service.store.errors import translate_errors

SAVEPOINT = "inbox_message"
# A cancel request for another backend: a no-op if it is idle, else its statement fails.
CANCEL_BACKEND = text("SELECT pg_cancel_backend(:pid)")


class MessageSavepoints:
    """One SAVEPOINT per message, issued on the driver's connection under one fixed name.

    SQLAlchemy's nested transactions name each savepoint afresh (sa_savepoint_1, _2, ...) and
    send SAVEPOINT and RELEASE as prepared statements: two round trips per message, plus a
    Parse of each new name, and a batch's 200 names flush the connection's statement cache
    (the handlers' own statements with them). Here they are plain simple-query commands, and
    a message's RELEASE (or ROLLBACK TO) waits to share a round trip with the next message's
    SAVEPOINT or with `flush()`: one round trip per message instead of four or more.
    """

    def __init__(self, driver: asyncpg.Connection, engine: AsyncEngine) -> None:
        self._driver = driver
        self._engine = engine
        self._pending = ""
        self._timeout_set = False
        self._limit_ms: int | None = None  # set by limit_statements, for the transaction

    @property
    def driver(self) -> asyncpg.Connection:
        """The driver connection of the batch's transaction, for statements of the inbox's own
        (`StagedRows.write`): send `flush()` first if a release or rollback may be pending."""
        return self._driver

    async def begin(self, statement_timeout_ms: int | None = None) -> None:
        """Open the next message's savepoint (ending the previous one's in the same trip).

        `statement_timeout_ms` bounds each of the message's statements on the server, so a
        handler stuck in one (a lock wait, `pg_sleep`) is cancelled there, not only abandoned
        by its client; a ROLLBACK TO the savepoint undoes the setting with the rest.
        """
        if not self._driver.is_in_transaction():
            raise RuntimeError("a message savepoint needs the batch's transaction to have begun")
        command = self._pending + f"SAVEPOINT {SAVEPOINT}"
        if statement_timeout_ms is not None:
            command += f"; SET LOCAL statement_timeout = {int(statement_timeout_ms)}"
            self._timeout_set = True
        self._pending = ""
        await self._driver.execute(command)

    async def limit_statements(self, statement_timeout_ms: int) -> None:
        """Without a savepoint (an optimistic batch, which a failure rolls back whole): bound
        the transaction's statements, sending the setting only when it changes."""
        if self._limit_ms == statement_timeout_ms:
            return
        command = self._pending + f"SET LOCAL statement_timeout = {int(statement_timeout_ms)}"
        self._pending = ""
        await self._driver.execute(command)
        self._limit_ms = statement_timeout_ms

    def defer(self, command: str) -> None:
        """Send `command` (a fixed one) with the next trip, before anything a handler sends."""
        self._pending += f"{command}; "

    def release(self) -> None:
        """Keep the message's effects (sent with the next begin or flush)."""
        self._pending = f"RELEASE SAVEPOINT {SAVEPOINT}; "

    def rollback(self) -> None:
        """Undo the message's effects (sent with the next begin or flush). Until then nothing
        else may run on the connection: an aborted transaction refuses every other statement.
        """
        self._pending = f"ROLLBACK TO SAVEPOINT {SAVEPOINT}; RELEASE SAVEPOINT {SAVEPOINT}; "

    async def cancel_statement(self) -> None:
        """Cancel the statement running on this connection, if one is, from another connection
        (the server answers it with an error; the transaction survives to its savepoint)."""
        async with translate_errors(), self._engine.connect() as other:
            await other.execute(CANCEL_BACKEND, {"pid": self._driver.get_server_pid()})

    async def flush(self) -> None:
        """Send a pending release or rollback now (before the batch's own statements), and
        lift the last message's statement timeout off them."""
        command, self._pending = self._pending, ""
        if self._timeout_set or self._limit_ms is not None:
            command += "SET LOCAL statement_timeout TO DEFAULT"
            self._timeout_set = False
            self._limit_ms = None
        if command:
            await self._driver.execute(command)


async def driver_of(conn: AsyncConnection) -> asyncpg.Connection:
    """The asyncpg connection under `conn`, for statements SQLAlchemy need not process."""
    raw = await conn.get_raw_connection()
    driver = raw.driver_connection
    assert isinstance(driver, asyncpg.Connection)
    return driver


async def message_savepoints(conn: AsyncConnection) -> MessageSavepoints:
    """Savepoints on `conn`'s driver connection; its transaction must have begun already."""
    return MessageSavepoints(await driver_of(conn), conn.engine)


@asynccontextmanager
async def batch_transaction(engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
    """A transaction committed when the block exits normally, rolled back otherwise."""
    async with translate_errors(), engine.connect() as conn, conn.begin():
        yield conn


@asynccontextmanager
async def driver_transaction(engine: AsyncEngine, begin: str) -> AsyncIterator[asyncpg.Connection]:
    """A transaction on a pooled connection's driver, opened by `begin` (BEGIN and whatever
    settings go with it, in one trip) and committed when the block exits normally."""
    async with translate_errors(), engine.connect() as conn:
        driver = await driver_of(conn)
        # SQLAlchemy has sent nothing on `conn`: this transaction is the driver's alone.
        try:
            await driver.execute(begin)
            yield driver
            await driver.execute("COMMIT")
        except BaseException:
            # Where the transaction stands is unknown (a statement failed, or this task was
            # cancelled mid-trip): the connection must not go back to the pool with it open.
            await conn.invalidate()
            raise


@asynccontextmanager
async def short_transaction(engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
    """A transaction for bookkeeping only (no handler runs in it)."""
    async with translate_errors(), engine.begin() as conn:
        yield conn
