"""The store's own exceptions, so callers never see driver errors."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout


class StoreUnavailable(Exception):
    """The database could not be reached or did not answer in time; nothing was committed."""


class StoreOverloaded(StoreUnavailable):
    """Too much is already waiting for the database; refused at once rather than queued."""


# Connection refused, socket gone, server shutting down, pool exhausted, statement timeout.
_UNAVAILABLE = (
    OperationalError,
    InterfaceError,
    PoolTimeout,
    OSError,
    asyncio.TimeoutError,
    asyncpg.exceptions.PostgresConnectionError,
    asyncpg.exceptions.CannotConnectNowError,
    asyncpg.exceptions.AdminShutdownError,
    asyncpg.exceptions.QueryCanceledError,
    asyncpg.exceptions.InterfaceError,
)


def is_unavailable(exc: BaseException) -> bool:
    if isinstance(exc, _UNAVAILABLE):
        return True
    if isinstance(exc, DBAPIError):
        return exc.connection_invalidated or isinstance(exc.orig, _UNAVAILABLE)
    return False


@asynccontextmanager
async def translate_errors() -> AsyncIterator[None]:
    """Turn the driver's "database unreachable" errors into `StoreUnavailable`."""
    try:
        yield
    except StoreUnavailable:
        raise
    except Exception as exc:
        if is_unavailable(exc):
            raise StoreUnavailable(f"{type(exc).__name__}: {exc}") from exc
        raise
