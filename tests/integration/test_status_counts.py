"""Counts by source and status (service/store/counts.py): the unfinished rows exact on every
call, the ended ones (processed, dead, discarded) counted again only once the last count is old
enough."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine

from service.core.db import create_engine
from service.core.settings import Settings
from service.store.counts import ENDED_COUNTS, EndedCounts, status_counts

INSERT = "INSERT INTO inbox_messages (source, message_id, status, body) VALUES ($1, $2, $3, '')"


@pytest.fixture
async def engine(database_url: str) -> AsyncIterator[AsyncEngine]:
    engine = create_engine(database_url, Settings(database_url=database_url))
    yield engine
    await engine.dispose()


def counted(engine: AsyncEngine) -> list[int]:
    """A list that grows by one each time `engine` counts the processed rows."""
    seen: list[int] = []

    def on_execute(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement == ENDED_COUNTS.text:
            seen.append(1)

    event.listen(engine.sync_engine, "before_cursor_execute", on_execute)
    return seen


def by_key(groups: list[Any]) -> dict[tuple[str, str], int]:
    return {(g.source, g.status): g.count for g in groups}


async def test_a_quick_count_is_never_reused(engine: AsyncEngine, db: asyncpg.Connection) -> None:
    processed = EndedCounts(engine)  # a few rows count in far less than 0.1 s
    await db.execute(INSERT, "a", "1", "processed")
    assert await processed.get() == {("a", "processed"): 1}
    await db.execute(INSERT, "a", "2", "processed")
    assert await processed.get() == {("a", "processed"): 2}


class Clock:
    """Time as the test moves it: each reading is a second after the last, so every count
    takes one second, "slow"."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


async def eventually(ask: Any, expected: Any) -> None:
    for _ in range(200):
        if await ask() == expected:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never {expected!r}; last {await ask()!r}")


async def test_a_slow_count_is_reused_then_recounted_without_anyone_waiting(
    engine: AsyncEngine, db: asyncpg.Connection
) -> None:
    clock = Clock()
    processed = EndedCounts(engine, slow_seconds=0.5, reuse_factor=10, clock=clock)
    queries = counted(engine)
    await db.execute(INSERT, "a", "1", "processed")
    await db.execute(INSERT, "a", "2", "pending")
    assert by_key(await status_counts(engine, processed)) == {
        ("a", "processed"): 1,
        ("a", "pending"): 1,
    }
    await db.execute(INSERT, "a", "3", "processed")
    await db.execute(INSERT, "b", "1", "dead")
    await db.execute(INSERT, "b", "2", "retrying")
    # The count took 1 s, so it is kept for 10: the unfinished statuses are counted again,
    # exactly; the ended ones (a dead message too) are as last counted.
    assert by_key(await status_counts(engine, processed)) == {
        ("a", "processed"): 1,
        ("a", "pending"): 1,
        ("b", "retrying"): 1,
    }
    assert len(queries) == 1

    clock.now += 10  # the kept count is now too old
    # Answered from it, while a new count runs.
    assert await processed.get() == {("a", "processed"): 1}
    await eventually(processed.get, {("a", "processed"): 2, ("b", "dead"): 1})
    assert len(queries) == 2


async def test_callers_asking_at_once_share_one_count(
    engine: AsyncEngine, db: asyncpg.Connection
) -> None:
    processed = EndedCounts(engine)
    queries = counted(engine)
    await db.execute(INSERT, "a", "1", "processed")
    assert (
        await asyncio.gather(*(processed.get() for _ in range(10)))
        == [{("a", "processed"): 1}] * 10
    )
    assert len(queries) == 1


async def test_a_failed_recount_keeps_the_last_count(
    engine: AsyncEngine, db: asyncpg.Connection, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    processed = EndedCounts(engine, slow_seconds=0.5, reuse_factor=10, clock=clock)
    await db.execute(INSERT, "a", "1", "processed")
    assert await processed.get() == {("a", "processed"): 1}
    await db.execute("ALTER TABLE inbox_messages RENAME TO inbox_messages_away")
    try:
        clock.now += 10
        for _ in range(200):
            assert await processed.get() == {("a", "processed"): 1}
            if "counting the ended messages failed" in caplog.text:
                break
            await asyncio.sleep(0.01)
        (failure,) = [r for r in caplog.records if r.name == "service.store.counts"]
        assert 'relation "inbox_messages" does not exist' in failure.error
    finally:
        await processed.close()
        await db.execute("ALTER TABLE inbox_messages_away RENAME TO inbox_messages")
