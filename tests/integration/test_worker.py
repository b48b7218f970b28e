"""The in-process worker on a real database: exactly-once effects, retries, dead letters."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator
from contextlib import contextmanager

import asyncpg
import pytest

import tests.handlers as handlers
from service.core.db import create_engine
from service.core.settings import Settings
from service.processing.pipeline import resolve_pipelines
from service.sources.config_file import parse_inbox_config
from service.worker.worker import Worker
from tests.conftest import AppFactory
from tests.processing_helpers import (
    attempts_of,
    config,
    create_effects,
    deliver_until,
    delivery,
    insert_messages,
    source,
    status_of,
    wait_until,
)

FINISHED = "SELECT count(*) FROM inbox_messages WHERE status IN ('processed', 'dead')"


@contextmanager
def recorded_calls() -> Iterator[list[str]]:
    """The ids the handlers that count their calls (`state["calls"]`) ran with, in order."""
    calls: list[str] = []
    handlers.state["calls"] = calls
    try:
        yield calls
    finally:
        handlers.state.pop("calls", None)


async def test_each_message_has_one_effect_when_delivered_twice_concurrently(
    worker_for: AppFactory, db: asyncpg.Connection
) -> None:
    async with worker_for(config("tests.handlers:record")) as client:
        gate = asyncio.Semaphore(20)

        async def send(i: int) -> int:
            async with gate:
                body = json.dumps({"n": i}).encode()
                response = await client.post(
                    "/webhooks/hooks", content=body, headers=delivery(f"m{i}")
                )
                return response.status_code

        codes = await asyncio.gather(*(send(i) for i in [*range(200), *range(200)]))
        assert set(codes) == {200}
        await wait_until(
            db, "SELECT count(*) FROM inbox_messages WHERE status = 'processed'", 200, 30
        )
    assert await db.fetchval("SELECT count(*) FROM effects") == 200
    assert await db.fetchval("SELECT count(DISTINCT message_id) FROM effects") == 200
    # Every delivery counted: on its row, or kept aside (inbox_receipts) if it met its message
    # in a running batch, for the worker's next poll to add (this one has stopped).
    counted = await db.fetchval(
        "SELECT (SELECT sum(receive_count) FROM inbox_messages)"
        " + (SELECT coalesce(sum(received), 0) FROM inbox_receipts)"
    )
    assert counted == 400
    # The handler saw the parsed payload of its own message.
    assert await db.fetchval("SELECT payload->>'n' FROM effects WHERE message_id = 'm7'") == "7"


async def test_a_handler_failing_twice_leaves_one_effect_from_attempt_three(
    worker_for: AppFactory, db: asyncpg.Connection
) -> None:
    async with worker_for(config("tests.handlers:fail_twice")) as client:
        await deliver_until(client, db, "flaky", "processed")
    effects = await db.fetch("SELECT attempt FROM effects")
    assert [e["attempt"] for e in effects] == [3]
    attempts = await attempts_of(db, "flaky")
    assert [(a["attempt"], a["outcome"]) for a in attempts] == [
        (1, "failed"),
        (2, "failed"),
        (3, "processed"),
    ]
    assert attempts[0]["error_type"] == "RuntimeError"
    assert attempts[0]["error"] == "flaky failure on attempt 1"
    assert "fail_twice" in attempts[0]["traceback"]
    assert attempts[0]["duration_ms"] >= 0
    assert attempts[0]["actor"].startswith("worker:")
    row = await db.fetchrow("SELECT attempts, processed_at, last_error FROM inbox_messages")
    assert row is not None
    assert row["attempts"] == 3
    assert row["processed_at"] is not None
    assert row["last_error"] is None


async def test_an_always_failing_handler_ends_dead_after_max_attempts_without_effect(
    worker_for: AppFactory, db: asyncpg.Connection
) -> None:
    cfg = config("tests.handlers:always_fail", max_attempts=3)
    async with worker_for(cfg) as client:
        await deliver_until(client, db, "doomed", "dead")
        await asyncio.sleep(0.3)  # nothing claims a dead message again
    assert await db.fetchval("SELECT count(*) FROM effects") == 0
    attempts = await attempts_of(db, "doomed")
    assert [a["outcome"] for a in attempts] == ["failed", "failed", "dead"]
    row = await db.fetchrow("SELECT attempts, last_error, processed_at FROM inbox_messages")
    assert row is not None
    assert row["attempts"] == 3
    assert row["last_error"] == "ValueError: downstream says no"
    assert row["processed_at"] is None


async def test_permanent_failure_is_dead_at_once(
    worker_for: AppFactory, db: asyncpg.Connection
) -> None:
    async with worker_for(config("tests.handlers:permanent")) as client:
        await deliver_until(client, db, "perm", "dead")
    attempts = await attempts_of(db, "perm")
    assert [a["outcome"] for a in attempts] == ["dead"]
    assert attempts[0]["error_type"] == "service.PermanentFailure"
    assert await db.fetchval("SELECT count(*) FROM effects") == 0


async def test_retry_later_waits_as_asked(worker_for: AppFactory, db: asyncpg.Connection) -> None:
    async with worker_for(config("tests.handlers:retry_once_later")) as client:
        await deliver_until(client, db, "later", "retrying", 5)
        await wait_until(db, "SELECT status FROM inbox_messages", "processed", 10)
    first, second = await attempts_of(db, "later")
    assert first["outcome"] == "retry_later"
    assert second["outcome"] == "processed"
    waited = (second["started_at"] - first["finished_at"]).total_seconds()
    assert 1.0 <= waited < 3.0
    assert [e["attempt"] for e in await db.fetch("SELECT attempt FROM effects")] == [2]


async def test_a_handler_that_commits_fails_its_attempt_and_leaves_no_effect(
    worker_for: AppFactory, db: asyncpg.Connection
) -> None:
    cfg = {
        "sources": {
            "hooks": config("tests.handlers:commits", max_attempts=1)["sources"]["hooks"],
            "quiet": config("tests.handlers:commits_quietly", max_attempts=1)["sources"]["hooks"],
        }
    }
    async with worker_for(cfg) as client:
        await client.post("/webhooks/hooks", content=b"{}", headers=delivery("c1"))
        await client.post("/webhooks/quiet", content=b"{}", headers=delivery("c2"))
        await wait_until(db, "SELECT count(*) FROM inbox_messages WHERE status = 'dead'", 2)
    assert await db.fetchval("SELECT count(*) FROM effects") == 0
    for message_id in ("c1", "c2"):
        (attempt,) = await attempts_of(db, message_id)
        assert attempt["error_type"] == "service.HandlerCommitError"
    (loud,) = await attempts_of(db, "c1")
    assert "must not commit" in loud["error"]


async def test_a_message_no_handler_matches_is_processed_with_a_note(
    worker_for: AppFactory, db: asyncpg.Connection
) -> None:
    cfg = config(handler=[{"target": "tests.handlers:record", "event_types": ["order.*"]}])
    async with worker_for(cfg) as client:
        await client.post("/webhooks/hooks", content=b"{}", headers=delivery("o", "order.paid"))
        await client.post("/webhooks/hooks", content=b"{}", headers=delivery("u", "user.new"))
        await wait_until(db, "SELECT count(*) FROM inbox_messages WHERE status = 'processed'", 2)
    assert [r["message_id"] for r in await db.fetch("SELECT message_id FROM effects")] == ["o"]
    (note,) = await attempts_of(db, "u")
    assert note["outcome"] == "skipped"
    assert note["error"] == "no handler matches event type 'user.new'; processed without effect"


async def test_graceful_shutdown_finishes_in_flight_work(
    worker_for: AppFactory, db: asyncpg.Connection
) -> None:
    handlers.slow_started = asyncio.Event()
    handlers.state["slow_seconds"] = 1.0
    try:
        async with worker_for(config("tests.handlers:slow")) as client:
            await client.post("/webhooks/hooks", content=b"{}", headers=delivery("slow"))
            await asyncio.wait_for(handlers.slow_started.wait(), 10)
            # The attempt was counted (and committed) before the handler began: a claim beside
            # the row, which the batch's transaction holds locked and unchanged.
            assert await db.fetchval("SELECT attempt FROM inbox_claims") == 1
            assert await status_of(db, "slow") == "pending"
            # Leaving the block shuts the app down while the handler is still sleeping.
    finally:
        handlers.slow_started = None
    assert await status_of(db, "slow") == "processed"
    assert await db.fetchval("SELECT attempts FROM inbox_messages") == 1
    assert await db.fetchval("SELECT count(*) FROM inbox_claims") == 0
    assert await db.fetchval("SELECT count(*) FROM effects") == 1


@pytest.mark.parametrize(
    ("handler", "messages"),
    [
        ("record_settings", ["m1", "m2"]),
        # The optimistic run fails on `bad`: the batch runs again, isolated, after locking its
        # rows again by id.
        ("record_settings_fail_on_bad", ["m1", "bad", "m2"]),
    ],
)
async def test_handlers_run_with_the_servers_planner_settings_and_their_own_timeout(
    worker_for: AppFactory, db: asyncpg.Connection, handler: str, messages: list[str]
) -> None:
    # The claim disables sorts for its own plan, and the hold of a batch that runs again
    # disables sequential scans, hash and merge joins for its own, both use generic plans, in
    # the transaction the handlers then run in: they must not inherit that, optimistic batch
    # or isolated.
    await insert_messages(db, *messages)
    cfg = config(f"tests.handlers:{handler}", handler_timeout_seconds=7, max_attempts=1)
    async with worker_for(cfg):
        await wait_until(db, FINISHED, len(messages), 15)
    settings = [json.loads(r["payload"]) for r in await db.fetch("SELECT payload FROM effects")]
    server = {"enable_sort": "on", "enable_seqscan": "on", "enable_hashjoin": "on"}
    inherited = {"enable_mergejoin": "on", "plan_cache_mode": "auto", "statement_timeout": "7s"}
    assert settings == [{**server, **inherited}] * 2


async def test_deliveries_committed_soon_after_a_batch_began_are_claimed_together(
    worker_for: AppFactory, db: asyncpg.Connection
) -> None:
    # One claim loop, woken only by notifications (the poller is slow), which linger 2 s after
    # a batch began.
    cfg = config("tests.handlers:record_transaction")
    settings = {"worker_poll_seconds": 60, "worker_concurrency": 1, "worker_linger_seconds": 2.0}
    processed = "SELECT count(*) FROM inbox_messages WHERE status = 'processed'"
    async with worker_for(cfg, **settings) as client:
        # The worker's first looks (at start, and when its listener connects) find nothing and
        # hold nothing back, once they are over.
        await asyncio.sleep(0.5)
        # A delivery after a quiet spell is claimed at once, not a linger later.
        started = asyncio.get_running_loop().time()
        await client.post("/webhooks/hooks", content=b"{}", headers=delivery("first"))
        await wait_until(db, processed, 1)
        assert asyncio.get_running_loop().time() - started < 1.5
        # Three more, each committed and notified on its own while the linger lasts.
        for message_id in ("m2", "m3", "m4"):
            response = await client.post(
                "/webhooks/hooks", content=b"{}", headers=delivery(message_id)
            )
            assert response.status_code == 200
        await wait_until(db, processed, 4)
    rows = await db.fetch("SELECT message_id, payload->>'transaction' AS tx FROM effects")
    batch_of = {r["message_id"]: r["tx"] for r in rows}
    assert batch_of["m2"] == batch_of["m3"] == batch_of["m4"] != batch_of["first"]


async def test_messages_of_other_sources_are_left_alone(
    worker_for: AppFactory, db: asyncpg.Connection
) -> None:
    # A source this worker's configuration does not name may belong to another deployment.
    await db.execute(
        "INSERT INTO inbox_messages (source, message_id, body) VALUES ('elsewhere', 'x', '')"
    )
    async with worker_for(config("tests.handlers:record")) as client:
        await client.post("/webhooks/hooks", content=b"{}", headers=delivery("mine"))
        await wait_until(
            db, "SELECT status FROM inbox_messages WHERE source = 'hooks'", "processed"
        )
    assert await status_of(db, "x") == "pending"


async def test_a_database_error_in_one_handler_spares_the_rest_of_its_batch(
    worker_for: AppFactory, db: asyncpg.Connection
) -> None:
    await insert_messages(db, "good1", "bad", "good2")
    cfg = config("tests.handlers:sql_error_on_bad", max_attempts=1)
    async with worker_for(cfg):
        await wait_until(db, FINISHED, 3)
    assert await status_of(db, "bad") == "dead"
    effects = await db.fetch("SELECT message_id FROM effects ORDER BY message_id")
    assert [e["message_id"] for e in effects] == ["good1", "good2"]
    (failed,) = await attempts_of(db, "bad")
    assert "no_such_table" in failed["error"]
    assert await db.fetchval("SELECT count(DISTINCT actor) FROM inbox_attempts") == 1


@pytest.mark.parametrize(
    ("bad", "stored"), [("bad-nul", "field\\x00value"), ("bad-surrogate", "field\\udcffvalue")]
)
async def test_an_error_message_text_cannot_hold_is_recorded_and_spares_the_rest_of_its_batch(
    worker_for: AppFactory, db: asyncpg.Connection, bad: str, stored: str
) -> None:
    await insert_messages(db, "good1", bad, "good2")
    cfg = config("tests.handlers:unstorable_error_on_bad", max_attempts=1)
    async with worker_for(cfg):
        await wait_until(db, FINISHED, 3)
    assert await status_of(db, bad) == "dead"
    effects = await db.fetch("SELECT message_id FROM effects ORDER BY message_id")
    assert [e["message_id"] for e in effects] == ["good1", "good2"]
    (failed,) = await attempts_of(db, bad)
    assert failed["error"] == stored  # the character written out, as repr() would
    assert failed["traceback"].endswith(f"ValueError: {stored}\n")
    last_error = "SELECT last_error FROM inbox_messages WHERE message_id = $1"
    assert await db.fetchval(last_error, bad) == f"ValueError: {stored}"


async def test_a_failure_in_a_batch_run_without_savepoints_commits_the_others_once(
    worker_for: AppFactory, db: asyncpg.Connection
) -> None:
    """A batch runs without a savepoint per message until a handler fails; then it rolls back
    and runs again with savepoints, the failed message not run again, and the source's next
    batches run with savepoints from the start."""
    await insert_messages(db, "good1", "bad1", "good2", "good3")
    cfg = config("tests.handlers:count_calls_fail_on_bad", max_attempts=1)
    with recorded_calls() as calls:  # one claim loop: the sequences below are one batch's each
        async with worker_for(cfg, worker_concurrency=1):
            await wait_until(db, FINISHED, 4)
            first_batch = list(calls)
            await insert_messages(db, "good4", "bad2")
            await wait_until(db, FINISHED, 6)
            second_batch = calls[len(first_batch) :]
    # good1 ran in the optimistic run and again in the isolated one; bad1 failed once and was
    # recorded from the first run; good2 and good3 ran once, isolated.
    assert first_batch == ["good1", "bad1", "good1", "good2", "good3"]
    assert second_batch == ["good4", "bad2"]  # isolated at once: good4 is not run twice
    effects = await db.fetch("SELECT message_id, attempt FROM effects ORDER BY message_id")
    assert [(e["message_id"], e["attempt"]) for e in effects] == [
        ("good1", 1),
        ("good2", 1),
        ("good3", 1),
        ("good4", 1),
    ]
    for bad in ("bad1", "bad2"):
        assert await status_of(db, bad) == "dead"
        (attempt,) = await attempts_of(db, bad)
        assert "no_such_table" in attempt["error"]
    outcomes = await db.fetch("SELECT outcome, count(*) FROM inbox_attempts GROUP BY outcome")
    assert dict((r["outcome"], r["count"]) for r in outcomes) == {"processed": 4, "dead": 2}


@pytest.mark.parametrize(
    ("handler", "error_type"),
    [
        ("add_effect_null_on_bad", "sqlalchemy.exc.IntegrityError"),
        ("insert_effect_null_on_bad", "asyncpg.exceptions.NotNullViolationError"),
    ],
    ids=["session.add", "ctx.insert"],
)
async def test_staged_rows_are_written_once_per_batch_and_a_failing_write_isolates(
    worker_for: AppFactory, db: asyncpg.Connection, handler: str, error_type: str
) -> None:
    """Rows staged with `ctx.session.add` (one flush) or `ctx.insert` (one COPY) in an
    optimistic batch are written once at its end; when that write fails, no message is to
    blame, so the batch runs again isolated, each message's rows written in its savepoint,
    which names the bad one: the others commit once, and no handler runs a third time."""
    await insert_messages(db, "good1", "bad1", "good2")
    cfg = config(f"tests.handlers:{handler}", max_attempts=1)
    # One claim loop: concurrent ones may split the three between them (SKIP LOCKED), and the
    # sequence below is that of one batch.
    with recorded_calls() as calls:
        async with worker_for(cfg, worker_concurrency=1):
            await wait_until(db, FINISHED, 3)
    assert calls == ["good1", "bad1", "good2", "good1", "bad1", "good2"]
    effects = await db.fetch("SELECT message_id, attempt FROM effects ORDER BY message_id")
    assert [(e["message_id"], e["attempt"]) for e in effects] == [("good1", 1), ("good2", 1)]
    assert await status_of(db, "bad1") == "dead"
    (attempt,) = await attempts_of(db, "bad1")
    assert attempt["error_type"] == error_type
    assert "source" in attempt["error"]  # the column whose NOT NULL the row broke
    assert await status_of(db, "good1") == "processed"


async def test_a_failing_flush_in_an_isolated_batch_fails_only_its_message(
    worker_for: AppFactory, db: asyncpg.Connection
) -> None:
    """For 10 s after a failure, the source's batches run isolated from the start. A staged row
    whose flush fails there makes the handler session roll back; joined to the batch's
    transaction, that used to roll back the whole batch (good3 went dead beside bad2). The
    session's own savepoint bounds it to its message."""
    await insert_messages(db, "good1", "bad1", "good2")
    cfg = config("tests.handlers:add_effect_null_on_bad", max_attempts=1)
    with recorded_calls() as calls:
        async with worker_for(cfg, worker_concurrency=1):
            await wait_until(db, FINISHED, 3)
            await insert_messages(db, "good3", "bad2", "good4")
            await wait_until(db, FINISHED, 6)
    # The second batch ran once, isolated: each handler once.
    assert calls[-3:] == ["good3", "bad2", "good4"]
    effects = await db.fetch("SELECT message_id FROM effects ORDER BY message_id")
    assert [e["message_id"] for e in effects] == ["good1", "good2", "good3", "good4"]
    for name in ("good1", "good2", "good3", "good4"):
        assert await status_of(db, name) == "processed"
    for name in ("bad1", "bad2"):
        assert await status_of(db, name) == "dead"
        (attempt,) = await attempts_of(db, name)
        assert attempt["error_type"] == "sqlalchemy.exc.IntegrityError"


async def test_after_a_failed_batch_flush_only_the_bad_messages_source_runs_isolated(
    db: asyncpg.Connection, database_url: str
) -> None:
    """A batch holds messages of two sources, and its one flush fails. The isolated run names
    the bad message; only its source's next batches take a savepoint per message."""
    await create_effects(db)
    await insert_messages(db, "good1", "bad1")
    await db.execute(
        "INSERT INTO inbox_messages (source, message_id, body) VALUES ('other', 'fine1', '{}')"
    )
    handler = "tests.handlers:add_effect_null_on_bad"
    inbox = {"sources": {name: source(handler, max_attempts=1) for name in ("hooks", "other")}}
    engine = create_engine(database_url, Settings(database_url=database_url))
    worker = Worker(engine, database_url, resolve_pipelines(parse_inbox_config(inbox)))
    try:
        with recorded_calls() as calls:
            assert await worker.run_batch() == 3
    finally:
        await engine.dispose()
    # Optimistic, then isolated: each handler twice.
    assert sorted(calls) == ["bad1", "bad1", "fine1", "fine1", "good1", "good1"]
    assert [await status_of(db, m) for m in ("good1", "bad1", "fine1")] == [
        "processed",
        "dead",
        "processed",
    ]
    # The worker's own record of which sources run isolated (a savepoint per message).
    assert set(worker._isolate_until) == {"hooks"}


async def test_rows_of_a_plain_sqlalchemy_class_commit_with_the_mark_or_not_at_all(
    worker_for: AppFactory, db: asyncpg.Connection
) -> None:
    """docs/handlers.md offers a plain mapped class as the cheaper row: it is staged, flushed
    and committed with its message's mark as a SQLModel row is, and rolled back with a
    failing message."""
    await insert_messages(db, "good1", "bad1", "good2")
    cfg = config("tests.handlers:add_mapped_effect_or_fail", max_attempts=1)
    async with worker_for(cfg):
        await wait_until(db, FINISHED, 3)
    effects = await db.fetch("SELECT message_id, attempt FROM effects ORDER BY message_id")
    assert [(e["message_id"], e["attempt"]) for e in effects] == [("good1", 1), ("good2", 1)]
    assert await status_of(db, "good1") == "processed"
    assert await status_of(db, "good2") == "processed"
    assert await status_of(db, "bad1") == "dead"


async def test_rows_staged_with_insert_commit_with_the_mark_or_not_at_all(
    worker_for: AppFactory, db: asyncpg.Connection
) -> None:
    """`ctx.insert` rows are written with their batch (one COPY) and committed with their
    messages' marks; a failing message's row is not written, whichever run it failed in: the
    optimistic one, or one with a savepoint per message (the source's batches after a
    failure)."""
    numbered = "UPDATE inbox_messages SET body = convert_to('{\"n\": ' || id || '}', 'UTF8')"
    await insert_messages(db, "good1", "bad1", "good2")
    await db.execute(numbered)
    cfg = config("tests.handlers:insert_effect_or_fail", max_attempts=1)
    async with worker_for(cfg, worker_concurrency=1):
        await wait_until(db, FINISHED, 3)
        await insert_messages(db, "bad2", "good3")  # isolated from the start
        await db.execute(numbered)
        await wait_until(db, FINISHED, 5)
    effects = await db.fetch(
        "SELECT e.message_id, e.attempt, e.payload = jsonb_build_object('n', m.id) AS same "
        "FROM effects e JOIN inbox_messages m ON m.id = e.inbox_id ORDER BY e.message_id"
    )
    assert [(e["message_id"], e["attempt"], e["same"]) for e in effects] == [
        ("good1", 1, True),
        ("good2", 1, True),
        ("good3", 1, True),
    ]
    for good in ("good1", "good2", "good3"):
        assert await status_of(db, good) == "processed"
    assert await status_of(db, "bad1") == "dead"
    assert await status_of(db, "bad2") == "dead"


async def test_a_row_staged_with_insert_into_a_column_the_table_lacks_fails_its_handler(
    worker_for: AppFactory, db: asyncpg.Connection
) -> None:
    await insert_messages(db, "m1")
    cfg = config("tests.handlers:insert_into_a_misspelt_column", max_attempts=1)
    async with worker_for(cfg):
        await wait_until(db, FINISHED, 1)
    (attempt,) = await attempts_of(db, "m1")
    assert (attempt["outcome"], attempt["error_type"]) == ("dead", "ValueError")
    assert attempt["error"] == "table 'effects' has no column 'atempt'"
    assert await db.fetchval("SELECT count(*) FROM effects") == 0


async def test_a_query_sees_the_rows_staged_with_add_before_it_in_the_batch(
    worker_for: AppFactory, db: asyncpg.Connection
) -> None:
    await insert_messages(db, "m1", "m2", "m3")
    handlers.state["seen"] = []
    try:
        async with worker_for(
            config("tests.handlers:add_then_count"),
            worker_concurrency=1,  # one batch, as the counts below are those of one
        ):
            await wait_until(
                db, "SELECT count(*) FROM inbox_messages WHERE status = 'processed'", 3
            )
            seen = list(handlers.state["seen"])
    finally:
        handlers.state.pop("seen", None)
    assert seen == [1, 2, 3]
    assert await db.fetchval("SELECT count(*) FROM effects") == 3


async def test_a_hung_handler_times_out_and_is_retried_without_effect(
    worker_for: AppFactory, db: asyncpg.Connection
) -> None:
    handlers.state["slow_seconds"] = 30.0  # far past the limit below
    try:
        cfg = config("tests.handlers:slow", handler_timeout_seconds=0.3, max_attempts=2)
        async with worker_for(cfg) as client:
            await deliver_until(client, db, "hung", "dead", 15)
    finally:
        handlers.state["slow_seconds"] = 1.0
    attempts = await attempts_of(db, "hung")
    timeout = "HandlerTimeout"
    assert [a["error_type"] for a in attempts] == [timeout, timeout]
    assert "handler_timeout_seconds" in attempts[0]["error"]
    assert await db.fetchval("SELECT count(*) FROM effects") == 0


async def test_while_deliveries_arrive_the_worker_runs_fewer_claim_loops(
    worker_for: AppFactory, db: asyncpg.Connection
) -> None:
    """Ingest first (issue 70): while deliveries are being committed, only
    `worker_ingest_concurrency` claim loops run batches; once they stop, every loop does."""
    cfg = config("tests.handlers:record_overlapping")
    # Deliveries count as arriving for 3 s after the last: a loaded machine's stall between
    # two of them must not read as ingest having stopped.
    settings = {
        "worker_concurrency": 4,
        "worker_ingest_concurrency": 1,
        "worker_ingest_quiet_seconds": 3.0,
        "worker_poll_seconds": 0.2,
    }
    processed = "SELECT count(*) FROM inbox_messages WHERE status = 'processed'"
    sent = 0
    async with worker_for(cfg, **settings) as client:
        stop_sending = asyncio.Event()

        async def send() -> None:
            nonlocal sent
            while not stop_sending.is_set():
                await client.post("/webhooks/hooks", content=b"{}", headers=delivery(f"d{sent}"))
                sent += 1
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop_sending.wait(), 0.05)

        sender = asyncio.create_task(send())
        # The worker has heard deliveries arrive: it ran the first few, each announced by its
        # NOTIFY (a look of the poller's before the first NOTIFY could still use every loop).
        await wait_until(
            db, "SELECT count(*) >= 5 FROM inbox_messages WHERE status = 'processed'", True
        )
        handlers.overlap["most"] = 0
        # A backlog of four batches lands while deliveries keep arriving.
        await insert_messages(db, *(f"a{i}" for i in range(400)))
        await wait_until(
            db,
            "SELECT count(*) FROM inbox_messages WHERE message_id LIKE 'a%' "
            "AND status = 'processed'",
            400,
            60,
        )
        while_arriving = handlers.overlap["most"]
        stop_sending.set()
        await sender
        await wait_until(db, processed, 400 + sent, 20)
        handlers.overlap["most"] = 0
        # Slower handlers now, so that one loop is still at it when the quiet spell ends.
        handlers.overlap["seconds"] = 0.02
        await insert_messages(db, *(f"b{i}" for i in range(400)))
        await wait_until(db, processed, 800 + sent, 60)
        once_stopped = handlers.overlap["most"]
    handlers.overlap["seconds"] = 0.005
    assert while_arriving == 1
    assert once_stopped >= 2
