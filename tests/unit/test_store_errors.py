"""Which driver errors read as the database being unavailable (a 503 the sender retries, the
connection replaced) and which as a refusal of the values written."""

from __future__ import annotations

import asyncpg
import pytest

from service.store.errors import StoreUnavailable, is_unavailable, translate_errors


async def test_a_connection_left_mid_operation_is_unavailable_not_a_bug() -> None:
    # What the driver raised when the database was stopped during a group commit.
    exc = asyncpg.exceptions.InternalClientError(
        "cannot switch to state 12; another operation (2) is in progress"
    )
    assert is_unavailable(exc)
    with pytest.raises(StoreUnavailable, match="InternalClientError"):
        async with translate_errors():
            raise exc


async def test_a_refused_value_is_not_unavailable() -> None:
    exc = asyncpg.exceptions.DataError("invalid input for query argument $1")
    assert not is_unavailable(exc)
    with pytest.raises(asyncpg.exceptions.DataError):
        async with translate_errors():
            raise exc
