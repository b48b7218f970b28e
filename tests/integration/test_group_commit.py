"""Group commit's correctness: attribution inside a batch, exact counts, failures, no waiting."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
import pytest

from service.core.db import asyncpg_dsn, create_engine
from service.core.settings import Settings
from service.sources.base import Message, Recorded
from service.store import group_commit
from service.store.errors import StoreOverloaded, StoreRefused, StoreUnavailable
from service.store.group_commit import GroupCommitter, _Deadlines
from service.store.receipts import fold_receipts


@pytest.fixture
async def committer(database_url: str) -> AsyncIterator[GroupCommitter]:
    engine = create_engine(database_url, Settings(database_url="x"))
    committer = GroupCommitter(engine, flushers=1)
    committer.start()
    yield committer
    await committer.close()
    await engine.dispose()


def record(committer: GroupCommitter, *ids: str) -> asyncio.Task[list[Recorded]]:
    messages = [Message(i, "t") for i in ids]
    return asyncio.ensure_future(committer.record("s", messages, {}, b"{}", "application/json"))


@asynccontextmanager
async def flusher_blocked(database_url: str, committer: GroupCommitter) -> AsyncIterator[None]:
    """While inside, the lone flusher is stuck on a lock: what is recorded forms one batch."""
    blocker = await asyncpg.connect(asyncpg_dsn(database_url))
    tx = blocker.transaction()
    await tx.start()
    await blocker.execute("LOCK TABLE inbox_messages IN ACCESS EXCLUSIVE MODE")
    first = record(committer, "warm-up")
    await asyncio.sleep(0.2)  # the lone flusher is now stuck on the lock with "warm-up"
    yield
    await asyncio.sleep(0.1)
    await tx.rollback()
    await blocker.close()
    assert (await first)[0].outcome == "accepted"


async def held_behind_a_lock(
    database_url: str, committer: GroupCommitter, *requests: tuple[str, ...]
) -> list[asyncio.Task[list[Recorded]]]:
    """Queue `requests` while a first flush is blocked, so they form one batch."""
    async with flusher_blocked(database_url, committer):
        return [record(committer, *ids) for ids in requests]


async def test_each_row_of_a_batch_keeps_its_own_values(
    database_url: str, committer: GroupCommitter, db: asyncpg.Connection
) -> None:
    # One batch of requests whose every stored value differs, bodies of different lengths
    # among them: each row must get its own request's values, whatever their order.
    sent: dict[str, dict[str, Any]] = {
        f"m{n:02d}": {
            "event_type": None if n % 4 == 0 else f"type.{n}",
            "headers": {"x-n": str(n), "x-quote": 'a "b" \\ c'},
            "body": bytes([n]) * n * 7,
            "content_type": f"text/x-{n}" if n % 3 else None,
            "trace_context": {"traceparent": f"00-{n:032x}-{n:016x}-01"} if n % 2 else None,
            "processed": n % 5 == 0,
        }
        for n in range(1, 25)
    }
    async with flusher_blocked(database_url, committer):
        tasks = {
            message_id: asyncio.ensure_future(
                committer.record(
                    "s",
                    [Message(message_id, v["event_type"], trace_context=v["trace_context"])],
                    v["headers"],
                    v["body"],
                    v["content_type"],
                    processed=v["processed"],
                )
            )
            for message_id, v in reversed(sent.items())
        }
    answered = {message_id: (await task)[0] for message_id, task in tasks.items()}

    rows = await db.fetch(
        "SELECT id, message_id, event_type, headers, body, content_type, trace_context, status,"
        " receive_count FROM inbox_messages WHERE message_id <> 'warm-up'"
    )
    assert len(rows) == len(sent)
    for row in rows:
        v = sent[row["message_id"]]
        assert answered[row["message_id"]].id == row["id"]
        assert row["event_type"] == v["event_type"]
        assert json.loads(row["headers"]) == v["headers"]
        assert row["body"] == v["body"]
        assert row["content_type"] == v["content_type"]
        stored_context = row["trace_context"]
        assert (stored_context and json.loads(stored_context)) == v["trace_context"]
        assert row["status"] == ("processed" if v["processed"] else "pending")
        assert row["receive_count"] == 1


async def test_duplicates_inside_one_batch_first_wins_and_counts_are_exact(
    database_url: str, committer: GroupCommitter, db: asyncpg.Connection
) -> None:
    await db.execute(
        "INSERT INTO inbox_messages (source, message_id, body) VALUES ('s', 'old', '')"
    )
    tasks = await held_behind_a_lock(
        database_url, committer, ("a",), ("b", "a"), ("a",), ("old",), ("c", "c")
    )
    results = [await t for t in tasks]
    outcomes = [[r.outcome for r in rs] for rs in results]
    assert outcomes == [
        ["accepted"],
        ["accepted", "duplicate"],
        ["duplicate"],
        ["duplicate"],
        ["accepted", "duplicate"],
    ]
    counts = dict(await db.fetch("SELECT message_id, receive_count FROM inbox_messages"))
    assert counts == {"warm-up": 1, "old": 2, "a": 3, "b": 1, "c": 2}
    ids = {r.message_id: r.id for rs in results for r in rs if r.outcome == "accepted"}
    stored = dict(await db.fetch("SELECT message_id, id FROM inbox_messages"))
    assert all(stored[k] == v for k, v in ids.items())


async def test_a_batch_meeting_a_stored_key_is_written_again_with_its_redelivery_counted(
    database_url: str, committer: GroupCommitter, db: asyncpg.Connection
) -> None:
    """Batches are first written with a plain insert; one that meets a stored key fails whole,
    is written again counting the redelivery, and batches count theirs from the start for a
    while: a second redelivery is not a second failed statement."""
    await db.execute(
        "INSERT INTO inbox_messages (source, message_id, body) VALUES ('s', 'old', '')"
    )
    assert [(await record(committer, "fresh"))[0].outcome] == ["accepted"]
    assert (committer.conflict_retries, committer.expects_conflicts) == (0, False)

    tasks = await held_behind_a_lock(database_url, committer, ("new-1",), ("old",), ("new-2",))
    outcomes = [[r.outcome for r in await t] for t in tasks]
    assert outcomes == [["accepted"], ["duplicate"], ["accepted"]]
    assert (committer.conflict_retries, committer.expects_conflicts) == (1, True)

    assert [r.outcome for r in await record(committer, "old", "new-3")] == [
        "duplicate",
        "accepted",
    ]
    assert committer.conflict_retries == 1  # written counting conflicts the first time

    counts = dict(await db.fetch("SELECT message_id, receive_count FROM inbox_messages"))
    assert counts == {"old": 3, "fresh": 1, "warm-up": 1, "new-1": 1, "new-2": 1, "new-3": 1}


async def test_batches_go_back_to_a_plain_insert_when_the_window_ends(
    committer: GroupCommitter, db: asyncpg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(group_commit, "CONFLICT_WINDOW_SECONDS", 1.0)
    assert (await record(committer, "a"))[0].outcome == "accepted"
    assert (await record(committer, "a"))[0].outcome == "duplicate"
    assert (committer.conflict_retries, committer.expects_conflicts) == (1, True)
    await asyncio.sleep(1.1)
    assert not committer.expects_conflicts
    assert (await record(committer, "b"))[0].outcome == "accepted"
    assert (await record(committer, "b"))[0].outcome == "duplicate"
    assert committer.conflict_retries == 2
    counts = dict(await db.fetch("SELECT message_id, receive_count FROM inbox_messages"))
    assert counts == {"a": 2, "b": 2}


async def test_redeliveries_keep_the_window_open(
    committer: GroupCommitter, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(group_commit, "CONFLICT_WINDOW_SECONDS", 1.5)
    await record(committer, "a")
    await record(committer, "a")  # the plain insert fails: the window opens
    for _ in range(4):  # 0.5 s apart, each redelivery keeps it open past the first 1.5 s
        await asyncio.sleep(0.5)
        assert committer.expects_conflicts
        assert (await record(committer, "a"))[0].outcome == "duplicate"
    assert (await record(committer, "fresh"))[0].outcome == "accepted"
    assert committer.conflict_retries == 1
    await asyncio.sleep(1.6)  # no redelivery for a whole window
    assert not committer.expects_conflicts


async def test_a_redelivery_is_a_duplicate_whatever_the_dedup_constraint_is_named(
    committer: GroupCommitter, db: asyncpg.Connection
) -> None:
    # An operator may rebuild the key (CREATE UNIQUE INDEX CONCURRENTLY, then ADD CONSTRAINT
    # ... USING INDEX) under another name: the failed plain insert must still be retried.
    await db.execute(
        "ALTER TABLE inbox_messages RENAME CONSTRAINT inbox_messages_source_message_id_key "
        "TO inbox_messages_dedup"
    )
    assert (await record(committer, "a"))[0].outcome == "accepted"
    assert (await record(committer, "a"))[0].outcome == "duplicate"
    assert committer.conflict_retries == 1
    assert await db.fetchval("SELECT receive_count FROM inbox_messages") == 2


# Rows PostgreSQL refuses, each for a different reason, had they got past the sources' checks.
REFUSED = {
    "id over the CHECK's 512": [Message("x" * 600, "t")],
    "NUL in text": [Message("nul", "a\x00b")],
    "unpaired surrogate": [Message("surrogate", "a\ud800b")],
    "event type over the b-tree entry limit": [Message("long", "".join(map(str, range(2000))))],
    "one bad message of a batch delivery": [Message("batch-ok", "t"), Message("batch-bad", "\x00")],
}


async def test_a_refused_row_fails_only_its_own_request(
    database_url: str, committer: GroupCommitter, db: asyncpg.Connection
) -> None:
    blocker = await asyncpg.connect(asyncpg_dsn(database_url))
    tx = blocker.transaction()
    await tx.start()
    await blocker.execute("LOCK TABLE inbox_messages IN ACCESS EXCLUSIVE MODE")
    first = record(committer, "warm-up")
    await asyncio.sleep(0.2)  # the lone flusher is stuck on the lock: the rest forms one batch
    good = [record(committer, f"good-{i}") for i in range(20)]
    bad = {
        reason: asyncio.ensure_future(committer.record("s", messages, {}, b"{}", None))
        for reason, messages in REFUSED.items()
    }
    good += [record(committer, f"good-{i}") for i in range(20, 40)]
    await asyncio.sleep(0.1)
    await tx.rollback()
    await blocker.close()

    assert (await first)[0].outcome == "accepted"
    assert [(await t)[0].outcome for t in good] == ["accepted"] * 40
    for reason, task in bad.items():
        with pytest.raises(StoreRefused):
            await task
        assert not isinstance(task.exception(), StoreUnavailable), reason
    stored = {r["message_id"] for r in await db.fetch("SELECT message_id FROM inbox_messages")}
    assert stored == {"warm-up", *(f"good-{i}" for i in range(40))}


async def test_an_error_that_is_not_unavailability_is_not_answered_as_one(
    committer: GroupCommitter, db: asyncpg.Connection
) -> None:
    await db.execute("ALTER TABLE inbox_messages RENAME TO inbox_messages_elsewhere")
    with pytest.raises(RuntimeError, match="group commit failed: UndefinedTableError") as info:
        await record(committer, "lost")
    # Not StoreUnavailable: a 503 would have the sender retry into the same error for ever.
    assert not isinstance(info.value, StoreUnavailable | StoreRefused)


async def test_many_concurrent_deliveries_with_duplicates(
    committer: GroupCommitter, db: asyncpg.Connection
) -> None:
    ids = [f"m{i % 150}" for i in range(600)]  # each id four times
    results = await asyncio.gather(*(record(committer, i) for i in ids))
    accepted = [rs[0].message_id for rs in results if rs[0].outcome == "accepted"]
    assert sorted(accepted) == sorted({*ids})
    rows = await db.fetch("SELECT receive_count FROM inbox_messages")
    assert len(rows) == 150
    assert {r["receive_count"] for r in rows} == {4}


async def test_a_lone_request_is_not_held_back(committer: GroupCommitter) -> None:
    await record(committer, "warm")  # first connection set-up is not what is measured
    started = time.monotonic()
    (result,) = await record(committer, "alone")
    assert result.outcome == "accepted"
    assert time.monotonic() - started < 0.5


async def test_backpressure_refuses_when_the_queue_is_full(database_url: str) -> None:
    engine = create_engine(database_url, Settings(database_url="x"))
    committer = GroupCommitter(engine, flushers=1, max_queued=2)
    # Not started: nothing drains the queue, as when the database stalls.
    first = record(committer, "1")
    second = record(committer, "2")
    await asyncio.sleep(0)
    with pytest.raises(StoreUnavailable, match="too many"):
        await record(committer, "3")
    first.cancel()
    second.cancel()
    await engine.dispose()


async def test_each_request_gives_up_when_its_own_wait_runs_out(database_url: str) -> None:
    """One timer serves every waiting request: each still gets its whole `wait_timeout`,
    counted from when it arrived, not from the first one's."""
    engine = create_engine(database_url, Settings(database_url="x"))
    committer = GroupCommitter(engine, flushers=1, wait_timeout=0.4)
    # Not started: nothing commits, as when the database stalls.
    loop = asyncio.get_running_loop()
    first = record(committer, "1")
    await asyncio.sleep(0.2)
    second = record(committer, "2")
    second_arrived = loop.time()
    with pytest.raises(StoreUnavailable, match="in time"):
        await first
    assert not second.done()
    with pytest.raises(StoreUnavailable, match="in time"):
        await second
    assert loop.time() - second_arrived >= 0.4
    await engine.dispose()


async def test_requests_answered_behind_one_still_waiting_are_not_kept() -> None:
    """A request stuck waiting (its batch's connection hung) must not make every request
    answered after it stay referenced until it gives up."""
    deadlines = _Deadlines(wait_timeout=60, max_queued=5)
    stuck: asyncio.Future[list[Recorded]] = asyncio.get_running_loop().create_future()
    deadlines.watch(stuck)
    for _ in range(1000):
        answered: asyncio.Future[list[Recorded]] = asyncio.get_running_loop().create_future()
        deadlines.watch(answered)
        answered.set_result([])
    assert len(deadlines._watched) <= 11
    assert deadlines._watched[0][1] is stuck
    deadlines.stop()
    assert not stuck.done()


async def test_a_stalled_database_holds_at_most_the_bound_across_waves(
    database_url: str, db: asyncpg.Connection
) -> None:
    engine = create_engine(database_url, Settings(database_url="x"))
    committer = GroupCommitter(engine, flushers=1, max_queued=40, wait_timeout=0.3)
    committer.start()
    blocker = await asyncpg.connect(asyncpg_dsn(database_url))
    tx = blocker.transaction()
    await tx.start()
    await blocker.execute("LOCK TABLE inbox_messages IN ACCESS EXCLUSIVE MODE")
    stalled = record(committer, "in-flight")  # the flusher holds it, waiting on the lock
    await asyncio.sleep(0.2)

    peak = 0

    async def sample() -> None:
        nonlocal peak
        while True:
            peak = max(peak, committer.held)
            await asyncio.sleep(0.005)

    sampler = asyncio.ensure_future(sample())
    body = b"b" * 10_000
    admitted = []
    for wave in range(3):
        requests = [
            asyncio.ensure_future(
                committer.record("s", [Message(f"w{wave}-{i}", "t")], {}, body, None)
            )
            for i in range(100)
        ]
        outcomes = await asyncio.gather(*requests, return_exceptions=True)
        assert all(isinstance(o, StoreUnavailable) for o in outcomes)
        # Refused at once for a full queue, or admitted and then timed out waiting.
        admitted.append(sum(1 for o in outcomes if not isinstance(o, StoreOverloaded)))
    sampler.cancel()
    # Requests that gave up waiting still hold their queued bodies until a flusher drops
    # them, so the second and third waves find the queue full.
    assert admitted == [39, 0, 0]
    assert peak <= 40

    await tx.rollback()
    await blocker.close()
    # The request taken for writing before the stall gave up too, but its row commits.
    assert isinstance((await asyncio.gather(stalled, return_exceptions=True))[0], StoreUnavailable)
    async with asyncio.timeout(5):
        while committer.held:  # the flusher drops the abandoned entries, unwritten
            await asyncio.sleep(0.01)
    assert (await record(committer, "after"))[0].outcome == "accepted"
    stored = {r["message_id"] for r in await db.fetch("SELECT message_id FROM inbox_messages")}
    assert stored == {"in-flight", "after"}
    await committer.close()
    await engine.dispose()


async def test_racing_batches_in_flight_count_every_redelivery_exactly_once(
    database_url: str, db: asyncpg.Connection
) -> None:
    """Two services' committers, four batches in flight each, write the same ids at once: a
    batch's key whose row another batch committed after this one's snapshot is still counted
    (the single statement's ON CONFLICT DO UPDATE locks the newest row, snapshot or not)."""
    engine = create_engine(database_url, Settings(database_url="x"))
    committers = [GroupCommitter(engine, flushers=4, max_batch=7) for _ in range(2)]
    for committer in committers:
        committer.start()
    ids = [f"r{i % 40}" for i in range(800)]  # each id twenty times
    random.Random(13).shuffle(ids)
    results = await asyncio.gather(*(record(committers[n % 2], i, i) for n, i in enumerate(ids)))
    accepted = [r.message_id for rs in results for r in rs if r.outcome == "accepted"]
    assert sorted(accepted) == sorted({*ids})  # each id accepted once, in all the races
    counts = dict(await db.fetch("SELECT message_id, receive_count FROM inbox_messages"))
    assert counts == {i: 40 for i in {*ids}}  # two messages per request, twenty requests
    for committer in committers:
        await committer.close()
    await engine.dispose()


@asynccontextmanager
async def a_held_row(
    database_url: str, db: asyncpg.Connection, message_id: str
) -> AsyncIterator[None]:
    """A stored message whose row another transaction holds locked while inside, as a batch
    of handlers does while they run; committed on the way out."""
    await db.execute(
        "INSERT INTO inbox_messages (source, message_id, body) VALUES ('s', $1, '')", message_id
    )
    worker = await asyncpg.connect(asyncpg_dsn(database_url))
    try:
        async with worker.transaction():
            await worker.execute(
                "SELECT 1 FROM inbox_messages WHERE message_id = $1 FOR UPDATE", message_id
            )
            yield
    finally:
        await worker.close()


async def test_a_redelivery_of_a_row_a_batch_holds_is_kept_aside_without_waiting(
    database_url: str, committer: GroupCommitter, db: asyncpg.Connection
) -> None:
    """A batch of handlers holds its messages' rows locked while they run. A redelivery of one
    is answered at once, a duplicate, with the new deliveries beside it; its count waits in
    inbox_receipts until the row is free, and is then added to the row, once."""
    async with a_held_row(database_url, db, "busy"):
        began = time.monotonic()
        tasks = [record(committer, "busy", "fresh"), record(committer, "busy")]
        outcomes = [[r.outcome for r in await t] for t in tasks]
        took = time.monotonic() - began
        assert outcomes == [["duplicate", "accepted"], ["duplicate"]]
        assert took < 2.0, took  # a lock wait of LOCK_WAIT, not the batch's whole run
        assert committer.deferred_batches >= 1
        kept = "SELECT sum(received) FROM inbox_receipts WHERE message_id = 'busy'"
        assert await db.fetchval(kept) == 2
        assert await fold_receipts(committer.engine) == 0  # still held: left for later
        assert await db.fetchval(kept) == 2
    assert await fold_receipts(committer.engine) == 2
    assert await fold_receipts(committer.engine) == 0
    row = await db.fetchrow(
        "SELECT receive_count, last_received_at > received_at AS later FROM inbox_messages "
        "WHERE message_id = 'busy'"
    )
    assert (row["receive_count"], row["later"]) == (3, True)
    assert await db.fetchval("SELECT count(*) FROM inbox_receipts") == 0


async def test_a_refused_row_beside_a_held_row_fails_only_its_own_request(
    database_url: str, committer: GroupCommitter, db: asyncpg.Connection
) -> None:
    """A batch that meets a held row and a refused one: written again past the lock wait
    (DEFER_BATCH), it is refused as a whole and halved like any other, so the bad request alone
    fails, each redelivery of the held row is kept aside once, the new message is stored. The
    refused id sorts after the held one, so the refusal comes after the lock wait."""
    async with a_held_row(database_url, db, "busy"):
        first = record(committer, "busy")  # the flusher waits LOCK_WAIT on the held row...
        await asyncio.sleep(0.01)  # ...while these three queue: the next batch
        busy, fresh = record(committer, "busy"), record(committer, "fresh")
        bad = asyncio.ensure_future(
            committer.record("s", REFUSED["id over the CHECK's 512"], {}, b"{}", None)
        )
        assert [r.outcome for r in await first] == ["duplicate"]
        assert [r.outcome for r in await busy] == ["duplicate"]
        assert [r.outcome for r in await fresh] == ["accepted"]
        with pytest.raises(StoreRefused):
            await bad
        assert committer.deferred_batches >= 2
    stored = {r["message_id"] for r in await db.fetch("SELECT message_id FROM inbox_messages")}
    assert stored == {"busy", "fresh"}
    assert await db.fetchval("SELECT sum(received) FROM inbox_receipts") == 2
    assert await fold_receipts(committer.engine) == 2
    assert (
        await db.fetchval("SELECT receive_count FROM inbox_messages WHERE message_id = 'busy'") == 3
    )


async def test_a_table_lock_is_waited_for_and_opens_no_conflict_window(
    database_url: str, committer: GroupCommitter, db: asyncpg.Connection
) -> None:
    """A lock on the whole table (a migration, an operator's LOCK) outlasts LOCK_WAIT too: the
    batch is written once the lock is gone, as before, with no receipt and no window of
    counted inserts, since it met no stored key."""
    tasks = await held_behind_a_lock(database_url, committer, ("a",), ("b",))
    assert [[r.outcome for r in await t] for t in tasks] == [["accepted"], ["accepted"]]
    assert committer.deferred_batches >= 1
    assert not committer.expects_conflicts
    assert await db.fetchval("SELECT count(*) FROM inbox_receipts") == 0


async def test_receipts_go_with_their_messages(db: asyncpg.Connection) -> None:
    await db.execute(
        "INSERT INTO inbox_messages (source, message_id, body) "
        "VALUES ('s', 'a', ''), ('s', 'b', ''), ('t', 'a', '')"
    )
    await db.execute(
        "INSERT INTO inbox_receipts (source, message_id, received) "
        "VALUES ('s', 'a', 1), ('s', 'b', 2), ('t', 'a', 1)"
    )
    await db.execute("DELETE FROM inbox_messages WHERE source = 's' AND message_id = 'a'")
    left = await db.fetch("SELECT source, message_id FROM inbox_receipts ORDER BY 1, 2")
    assert [tuple(r) for r in left] == [("s", "b"), ("t", "a")]
    await db.execute("TRUNCATE inbox_messages")
    assert await db.fetchval("SELECT count(*) FROM inbox_receipts") == 0
