"""A throttled destination's backlog costs about its rate, not its depth (issue 63): its runs
are claimed once to be queued, then each once more when its token exists, while another
source's messages drain beside it. (Before: every run held by the rate limit waited only for
the next token and came due again, so a backlog was claimed and deferred over and over.) And
a queued run claimed late still runs on its slot's token, so a slowed worker keeps the
destination at its limit instead of sending late runs to the queue's end."""

from __future__ import annotations

import asyncio
import time

import asyncpg

from tests.conftest import AppFactory
from tests.processing_helpers import insert_messages, source, wait_until

RATE, BACKLOG, OTHERS = 2.0, 300, 200
# The slow destination's runs to watch after the backlog is queued: about RUNS / RATE seconds.
RUNS = 8
# Claims beyond one per token: a wake-up late by a token's time (a loaded machine) costs a
# run its slot, and it queues again.
SLACK = 12

# Each claim of a message by the worker writes its `inbox_claims` row: count them, by source.
COUNT_CLAIMS = """
CREATE TABLE claim_log (source text NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE FUNCTION log_claim() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO claim_log (source)
    SELECT m.source FROM inbox_messages AS m WHERE m.id = NEW.message_id;
    RETURN NEW;
END $$;
CREATE TRIGGER log_claim AFTER INSERT ON inbox_claims FOR EACH ROW EXECUTE FUNCTION log_claim();
"""
SLOW_CLAIMS = "SELECT count(*) FROM claim_log WHERE source = 'hooks'"
SLOW_DONE = (
    "SELECT count(*) FROM inbox_destinations WHERE destination = 'slow' AND status = 'processed'"
)


async def test_a_throttled_backlog_is_claimed_at_its_rate_while_another_source_drains(
    worker_for: AppFactory, db: asyncpg.Connection
) -> None:
    await db.execute(COUNT_CLAIMS)
    slow = {"handlers": ["tests.handlers:record"], "rate_limit": f"{RATE:g}/s"}
    config = {
        "sources": {
            "hooks": source(destinations={"slow": slow}),
            "other": source("tests.handlers:record"),
        }
    }
    await insert_messages(db, *(f"m-{i}" for i in range(BACKLOG)))
    # Small batches: each held back run used to wait at most a batch's worth of tokens.
    async with worker_for(config, worker_batch_size=10, worker_concurrency=2):
        # Every run of the backlog asked once: now each is queued (or ran).
        await wait_until(
            db, "SELECT count(*) FROM inbox_destinations WHERE destination = 'slow'", BACKLOG
        )
        started, claims_before = time.monotonic(), await db.fetchval(SLOW_CLAIMS)
        done_before = await db.fetchval(SLOW_DONE)
        await db.executemany(
            "INSERT INTO inbox_messages (source, message_id, body) VALUES ('other', $1, '{}')",
            [(f"o-{i}",) for i in range(OTHERS)],
        )
        await db.execute("NOTIFY webhook_inbox")
        await wait_until(db, "SELECT count(*) FROM effects WHERE source = 'other'", OTHERS)
        others_in = time.monotonic() - started
        # Generous for a loaded machine: the bound below grows with the time taken.
        await wait_until(db, SLOW_DONE, done_before + RUNS, timeout=RUNS / RATE * 8)
        elapsed = time.monotonic() - started
        claims = await db.fetchval(SLOW_CLAIMS) - claims_before
    print(f"{claims} claims of the backlog in {elapsed:.1f} s; the other source in {others_in:.1f}")
    assert claims <= elapsed * RATE + SLACK, (claims, elapsed)
    # Deferred, not failed: each slow run that ran did so once, with the one attempt.
    rows = await db.fetch(
        "SELECT status, attempts, count(*) AS n FROM inbox_destinations GROUP BY 1, 2"
    )
    assert {(r["status"], r["attempts"]) for r in rows} <= {("pending", 0), ("processed", 1)}
    assert (
        await db.fetchval("SELECT count(*) FROM inbox_attempts WHERE outcome <> 'processed'") == 0
    )
    assert (
        await db.fetchval("SELECT count(*) - count(DISTINCT (source, message_id)) FROM effects")
        == 0
    )


# A 10/s destination's backlog beside a source whose handler blocks the worker's event loop
# (BUSY messages a second arriving all along, each holding it BUSY_SECONDS, as a loaded machine
# would), with four claim loops of two: the queued runs are claimed and admitted late, by
# siblings, each in its own admission.
FAST, FAST_BACKLOG, BUSY, BUSY_SECONDS = 10.0, 60, 6, 0.13
FAST_DONE = (
    "SELECT processed_at FROM inbox_destinations "
    "WHERE destination = 'fast' AND status = 'processed' ORDER BY processed_at"
)


async def test_a_queued_run_claimed_late_keeps_its_slot_so_the_limit_is_used(
    worker_for: AppFactory, db: asyncpg.Connection
) -> None:
    fast = {"handlers": ["tests.handlers:record"], "rate_limit": f"{FAST:g}/s"}
    config = {
        "sources": {
            "hooks": source(destinations={"fast": fast}),
            "busy": source("tests.handlers:block_loop"),
        }
    }
    await db.execute(COUNT_CLAIMS)
    await insert_messages(db, *(f"m-{i}" for i in range(FAST_BACKLOG)))
    sent, done = 0, 0
    async with worker_for(config, worker_batch_size=2, worker_concurrency=4):
        started = time.monotonic()
        deadline = started + FAST_BACKLOG / FAST * 6
        while done < FAST_BACKLOG and time.monotonic() < deadline:
            due = int((time.monotonic() - started) * BUSY) + 1
            await db.executemany(
                "INSERT INTO inbox_messages (source, message_id, body) VALUES ('busy', $1, $2)",
                [(f"b-{i}", f'{{"sleep": {BUSY_SECONDS}}}'.encode()) for i in range(sent, due)],
            )
            await db.execute("NOTIFY webhook_inbox")
            sent = max(sent, due)
            done = len(await db.fetch(FAST_DONE))
            await asyncio.sleep(1 / BUSY)
        busy = await db.fetchval(
            "SELECT count(*) FROM inbox_messages WHERE source = 'busy' AND status = 'processed'"
        )
    times = [r["processed_at"] for r in await db.fetch(FAST_DONE)]
    assert len(times) == FAST_BACKLOG, f"{len(times)} of the backlog ran in time"
    # After the first second's burst: one run a token, had no slot been lost.
    after_burst = times[int(FAST) :]
    span = (after_burst[-1] - after_burst[0]).total_seconds()
    rate = (len(after_burst) - 1) / span
    claims = await db.fetchval(SLOW_CLAIMS)
    print(f"the 10/s destination ran at {rate:.1f}/s, {claims} claims, beside {busy} busy runs")
    assert busy > BUSY * span / 2, "the busy source did not keep the worker busy"
    # No run lost its slot: each was claimed once to be queued (or run) and once to run.
    assert claims <= 2 * FAST_BACKLOG, claims
    # Below the limit only by what the worker could not run (it stalls at a load above 10).
    assert FAST * 0.7 <= rate <= FAST * 1.2, rate
    # Each run once, with its one attempt; the waits spent none.
    rows = await db.fetch(
        "SELECT status, attempts, count(*) AS n FROM inbox_destinations GROUP BY 1, 2"
    )
    assert {(r["status"], r["attempts"], r["n"]) for r in rows} == {("processed", 1, FAST_BACKLOG)}
    assert (
        await db.fetchval("SELECT count(*) - count(DISTINCT (source, message_id)) FROM effects")
        == 0
    )
