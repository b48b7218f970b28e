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


class StoreRefused(Exception):
    """The database refused a delivery's own values (a data error, a constraint, a size limit,
    text it cannot encode): the same bytes would be refused again, and nothing was committed."""


# Connection refused, socket gone, server shutting down, pool exhausted, statement timeout,
# and a connection the driver left mid-operation when the server went away under it
# (InternalClientError "cannot switch to state …; another operation is in progress", seen when
# the database was stopped during a group commit): unusable, so replaced, and a 503.
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
    asyncpg.exceptions.InternalClientError,
)


# Errors caused by the values of a row rather than by the database's state: SQLSTATE class 22
# (data exception: NUL, bad encoding, out of range), 23 (a constraint) and 54 (program limit:
# an index entry too large), and the driver's own refusal to encode an argument (a ValueError,
# such as a string holding an unpaired surrogate).
_REFUSALS = (
    asyncpg.exceptions.DataError,
    asyncpg.exceptions.IntegrityConstraintViolationError,
    asyncpg.exceptions.ProgramLimitExceededError,
    ValueError,
)


def is_refusal(exc: BaseException) -> bool:
    """Whether `exc` says the database refused the values written, not that it is unwell."""
    error: BaseException | None = exc
    # The driver's error sits under SQLAlchemy's wrapper and its asyncpg adapter's, if any.
    for _ in range(3):
        if error is None:
            return False
        if isinstance(error, _REFUSALS):
            return True
        error = error.orig if isinstance(error, DBAPIError) else error.__cause__
    return False


def _underlying(
    exc: BaseException, kinds: type[BaseException] | tuple[type[BaseException], ...]
) -> BaseException | None:
    """The first error of `kinds` down `exc`'s chain: SQLAlchemy's wrapper, its asyncpg
    adapter's, then the driver's own error; None when none is."""
    error: BaseException | None = exc
    while error is not None and not isinstance(error, kinds):
        error = error.orig if isinstance(error, DBAPIError) else error.__cause__
    return error


def refused(exc: BaseException) -> StoreRefused:
    """`StoreRefused` saying in one line why the database refused a row (`is_refusal(exc)`)."""
    error = _underlying(exc, (asyncpg.PostgresError, ValueError))
    if isinstance(error, asyncpg.PostgresError) and error.__cause__ is None:
        # The server's first line names the limit or constraint, never the value.
        return StoreRefused(str(error).splitlines()[0][:200])
    # The driver's own encoding errors quote the values: keep those out of answers and logs.
    return StoreRefused("a value could not be encoded for the database")


def is_unavailable(exc: BaseException) -> bool:
    if is_refusal(exc):
        # asyncpg's client-side DataError ("invalid input for query argument") is also an
        # InterfaceError, which would otherwise read as a broken connection.
        return False
    if isinstance(exc, _UNAVAILABLE):
        return True
    if isinstance(exc, DBAPIError):
        return exc.connection_invalidated or isinstance(exc.orig, _UNAVAILABLE)
    return False


# The server refused the connection itself: a wrong role, password or database name.
_LOGIN_REFUSALS = (
    asyncpg.exceptions.InvalidAuthorizationSpecificationError,
    asyncpg.exceptions.InvalidCatalogNameError,
)


def login_refusal(exc: BaseException) -> str | None:
    """The server's one line when `exc` is its refusal of the connection itself (a wrong role,
    password or database name: no retry helps), else None."""
    error = _underlying(exc, _LOGIN_REFUSALS)
    return None if error is None else str(error).splitlines()[0][:200]


def is_lock_timeout(exc: BaseException) -> bool:
    """Whether `exc` is the server's "could not obtain lock" (`lock_timeout` ran out)."""
    return _underlying(exc, asyncpg.exceptions.LockNotAvailableError) is not None


def is_missing_table(exc: BaseException) -> bool:
    """Whether `exc` is the server's "relation does not exist": a database no migration has
    run on (or, for a table of the inbox's, one migrated by an unrelated project)."""
    return _underlying(exc, asyncpg.UndefinedTableError) is not None


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
