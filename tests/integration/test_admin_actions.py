"""Admin retry, replay, discard and bulk retry: state transitions and the recorded history."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg

from service.api.security import token_fingerprint
from service.core.db import asyncpg_dsn, create_engine
from service.core.schema import Status
from service.core.settings import Settings
from service.store.admin import MessageFilter, bulk_retry
from service.store.attempts import record_results
from service.store.claims import claim_due, expired_leases, hold_claimed, lock_due
from service.store.results import AttemptResult, MessageRow
from service.store.savepoints import short_transaction
from tests.admin_seed import AUTH, CONFIG, TOKEN, seed, seed_in, status_of
from tests.conftest import AppFactory

FINGERPRINT = token_fingerprint(TOKEN)


def admin_client(client_for: AppFactory) -> Any:
    return client_for(CONFIG, admin_tokens=[TOKEN, "another-admin-token"])


async def history(db: asyncpg.Connection, message: int) -> list[tuple[str, int, str | None]]:
    rows = await db.fetch(
        "SELECT outcome, attempt, actor FROM inbox_attempts WHERE message_id = $1 ORDER BY id",
        message,
    )
    return [(r["outcome"], r["attempt"], r["actor"]) for r in rows]


async def test_retry_gives_a_fresh_budget_and_records_who(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    ids = {
        status: await seed(
            db, f"m-{status}", status=status, attempts=5, last_error="handler failed"
        )
        for status in ("dead", "retrying", "discarded")
    }
    await db.execute(
        "UPDATE inbox_messages SET next_attempt_at = now() + interval '1 day' WHERE id = $1",
        ids["retrying"],
    )
    before = datetime.now(UTC)
    async with admin_client(client_for) as client:
        responses = {
            status: await client.post(f"/admin/messages/{row_id}/retry", headers=AUTH)
            for status, row_id in ids.items()
        }
    for status, response in responses.items():
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["status"] == "pending"
        assert body["attempt_count"] == 0
        assert body["action"] == "admin_retry"
        assert TOKEN not in response.text
        row = await db.fetchrow("SELECT * FROM inbox_messages WHERE id = $1", ids[status])
        assert row["status"] == "pending"
        # A fresh budget of max_attempts from here; the numbering goes on from 5.
        assert (row["attempts"], row["budget_start"]) == (5, 5)
        assert row["next_attempt_at"] <= datetime.now(UTC)
        assert row["locked_until"] is None
        assert row["last_error"] == "handler failed"  # kept as the record of why it failed
        assert await history(db, ids[status]) == [("admin_retry", 5, FINGERPRINT)]
        started = await db.fetchval(
            "SELECT started_at FROM inbox_attempts WHERE message_id = $1", ids[status]
        )
        assert started >= before - timedelta(seconds=5)
    assert FINGERPRINT.startswith("token:")
    assert TOKEN not in FINGERPRINT


async def test_retry_refuses_unfinished_and_unknown_messages(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    pending, processing = await seed_in(db, "pending", "processing")
    async with admin_client(client_for) as client:
        for row_id in (pending, processing):
            response = await client.post(
                f"/admin/messages/{row_id}/retry", json={"force": True}, headers=AUTH
            )
            assert response.status_code == 409
            assert response.headers["content-type"] == "application/problem+json"
        missing = await client.post("/admin/messages/424242/retry", headers=AUTH)
        extra = await client.post(
            f"/admin/messages/{pending}/retry", json={"forse": True}, headers=AUTH
        )
    assert missing.status_code == 404
    assert extra.status_code == 422
    assert await status_of(db, pending) == "pending"
    assert await status_of(db, processing) == "processing"
    assert await history(db, pending) == []


async def test_replaying_a_processed_message_needs_force(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    done = await seed(db, "m-done", status="processed", attempts=1)
    async with admin_client(client_for) as client:
        unforced = await client.post(f"/admin/messages/{done}/retry", headers=AUTH)
        not_forced = await client.post(
            f"/admin/messages/{done}/retry", json={"force": False}, headers=AUTH
        )
        assert await status_of(db, done) == "processed"
        assert await history(db, done) == []
        forced = await client.post(
            f"/admin/messages/{done}/retry", json={"force": True}, headers=AUTH
        )
    assert unforced.status_code == 409
    assert "force" in unforced.json()["detail"]
    assert not_forced.status_code == 409
    assert forced.status_code == 200
    assert forced.json()["action"] == "admin_replay"
    row = await db.fetchrow("SELECT * FROM inbox_messages WHERE id = $1", done)
    assert (row["status"], row["attempts"] - row["budget_start"], row["processed_at"]) == (
        "pending",
        0,
        None,
    )
    assert await history(db, done) == [("admin_replay", 1, FINGERPRINT)]


async def test_discard_keeps_the_dedup_row_so_a_redelivery_is_a_duplicate(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    delivery = {"X-Message-Id": "evt-discard", "content-type": "application/json"}
    async with admin_client(client_for) as client:
        accepted = await client.post("/webhooks/hooks", content=b"{}", headers=delivery)
        row_id = accepted.json()["id"]
        discarded = await client.post(f"/admin/messages/{row_id}/discard", headers=AUTH)
        again = await client.post(f"/admin/messages/{row_id}/discard", headers=AUTH)
        redelivered = await client.post("/webhooks/hooks", content=b"{}", headers=delivery)
    assert discarded.status_code == 200
    assert discarded.json()["status"] == "discarded"
    assert discarded.json()["action"] == "admin_discard"
    assert again.status_code == 200
    assert again.json()["action"] == "none"
    assert redelivered.json() == {"status": "duplicate", "message_id": "evt-discard"}
    row = await db.fetchrow("SELECT status, receive_count FROM inbox_messages")
    assert (row["status"], row["receive_count"]) == ("discarded", 2)
    assert await history(db, row_id) == [("admin_discard", 0, FINGERPRINT)]


async def test_discard_refuses_processed_and_unknown(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    done, dead = await seed_in(db, "processed", "dead")
    async with admin_client(client_for) as client:
        assert (
            await client.post(f"/admin/messages/{done}/discard", headers=AUTH)
        ).status_code == 409
        assert (await client.post("/admin/messages/9999/discard", headers=AUTH)).status_code == 404
        assert (
            await client.post(f"/admin/messages/{dead}/discard", headers=AUTH)
        ).status_code == 200
    assert await status_of(db, done) == "processed"
    assert await status_of(db, dead) == "discarded"


def late_finish(message: int, attempt: int) -> AttemptResult:
    """The outcome a killed attempt's process would have written, had it lived on."""
    now = datetime.now(UTC)
    return AttemptResult(message, attempt, Status.PROCESSED, "processed", now, now)


async def test_a_killed_processs_lease_is_discarded_at_once_and_never_runs_again(
    client_for: AppFactory, db: asyncpg.Connection, database_url: str
) -> None:
    # A worker killed mid-attempt leaves its lease live for up to the lease margin, and no
    # lock: the operator's discard goes through at once instead of answering 409.
    leased = await seed(db, "m-poison", status="processing", attempts=2)
    await db.execute(
        "UPDATE inbox_messages SET locked_until = now() + interval '30 seconds' WHERE id = $1",
        leased,
    )
    async with admin_client(client_for) as client:
        discarded = await client.post(f"/admin/messages/{leased}/discard", headers=AUTH)
    assert discarded.status_code == 200, discarded.text
    assert (discarded.json()["status"], discarded.json()["action"]) == (
        "discarded",
        "admin_discard",
    )
    row = await db.fetchrow("SELECT status, attempts, locked_until FROM inbox_messages")
    assert (row["status"], row["attempts"], row["locked_until"]) == ("discarded", 2, None)
    assert await history(db, leased) == [("admin_discard", 2, FINGERPRINT)]
    # Its lease expires unreaped: neither the reaper nor a claim takes the message, and the
    # killed attempt's finish, were it to come late, is fenced off.
    await db.execute("UPDATE inbox_messages SET locked_until = now() - interval '1 second'")
    engine = create_engine(database_url, Settings(database_url=database_url))
    try:
        async with short_transaction(engine) as conn:
            assert await expired_leases(conn, 10) == []
        assert await claim_due(engine, {"hooks": 30.0}, 10) == []
        assert await record_results(engine, [late_finish(leased, 2)], "late", leased=True) == set()
    finally:
        await engine.dispose()
    assert await status_of(db, leased) == "discarded"
    assert await history(db, leased) == [("admin_discard", 2, FINGERPRINT)]


async def claimed_between_runs(db: asyncpg.Connection) -> int:
    """A `retrying` message whose second attempt a batch has claimed (inbox_claims) and not
    yet finished: its row is unlocked between the batch's optimistic run and its rerun."""
    claimed = await seed(db, "m-claimed", status="retrying", attempts=1)
    await db.execute(
        "INSERT INTO inbox_claims (message_id, attempt, locked_until) "
        "VALUES ($1, 2, now() + interval '30 seconds')",
        claimed,
    )
    return claimed


async def test_a_batch_claim_without_a_lock_is_discarded_at_once_and_never_runs_again(
    client_for: AppFactory, db: asyncpg.Connection, database_url: str
) -> None:
    # A batch whose process was killed (or whose optimistic run rolled back) holds no lock, but
    # its claim stands: the message shows `processing`. A retry is refused; a discard takes
    # the message out of the batch's hands at once, its claimed attempt counted.
    claimed = await claimed_between_runs(db)
    async with admin_client(client_for) as client:
        retry = await client.post(f"/admin/messages/{claimed}/retry", headers=AUTH)
        shown = (await client.get(f"/admin/messages/{claimed}", headers=AUTH)).json()
        discard = await client.post(f"/admin/messages/{claimed}/discard", headers=AUTH)
    assert retry.status_code == 409
    assert "processing" in retry.json()["detail"]
    assert shown["status"] == "processing"
    assert discard.status_code == 200, discard.text
    row = await db.fetchrow("SELECT status, attempts FROM inbox_messages")
    assert (row["status"], row["attempts"]) == ("discarded", 2)
    assert await db.fetchval("SELECT count(*) FROM inbox_claims") == 0
    assert await history(db, claimed) == [("admin_discard", 2, FINGERPRINT)]
    engine = create_engine(database_url, Settings(database_url=database_url))
    try:
        # The batch's rerun, or its late finish, finds the message no longer its own.
        async with engine.begin() as conn:
            batch = await lock_due(conn, ["hooks"], 10)
            assert (batch.rows, batch.abandoned) == ([], [])
            row = MessageRow(claimed, "hooks", "m-claimed", None, 1, {}, b"", None)
            assert await hold_claimed(conn, [row], leased=False) == set()
        assert (
            await record_results(engine, [late_finish(claimed, 2)], "late", leased=False) == set()
        )
    finally:
        await engine.dispose()
    assert await status_of(db, claimed) == "discarded"


async def test_an_action_on_a_message_a_batch_holds_is_refused_without_waiting_for_it(
    client_for: AppFactory, db: asyncpg.Connection, database_url: str
) -> None:
    # A batch of handlers holds its messages' rows locked until it commits, which may take as
    # long as its handlers do: an admin action waits a moment for the lock, then is refused
    # as for a message in flight, instead of hanging on the batch.
    held = await seed(db, "m-held", status="retrying", attempts=1)
    batch = await asyncpg.connect(asyncpg_dsn(database_url))
    try:
        await batch.execute("BEGIN")
        await batch.execute("SELECT 1 FROM inbox_messages WHERE id = $1 FOR UPDATE", held)
        async with admin_client(client_for) as client:
            discard, retry = await asyncio.wait_for(
                asyncio.gather(
                    client.post(f"/admin/messages/{held}/discard", headers=AUTH),
                    client.post(f"/admin/messages/{held}/retry", headers=AUTH),
                ),
                15,
            )
            for refused in (discard, retry):
                assert refused.status_code == 409, refused.text
                assert "processing" in refused.json()["detail"]
            assert await status_of(db, held) == "retrying"
            await batch.execute("ROLLBACK")
            # Once the batch has ended, the same action goes through.
            done = await client.post(f"/admin/messages/{held}/discard", headers=AUTH)
        assert done.status_code == 200, done.text
    finally:
        await batch.close()
    assert await status_of(db, held) == "discarded"
    assert await history(db, held) == [("admin_discard", 1, FINGERPRINT)]


async def test_a_bulk_retry_leaves_a_message_claimed_by_a_batch_between_its_runs(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    # As a retry of the one message is refused, a bulk retry of the failed ones passes over a
    # `retrying` message whose batch is in flight, and retries the others.
    claimed = await claimed_between_runs(db)
    failed = await seed(db, "m-failed", status="retrying", attempts=1)
    async with admin_client(client_for) as client:
        dry = await client.post("/admin/messages/retry", json={"dry_run": True}, headers=AUTH)
        real = await client.post("/admin/messages/retry", json={}, headers=AUTH)
    assert dry.json() == {"matched": 1, "retried": 0}
    assert real.json() == {"matched": 1, "retried": 1}
    assert await status_of(db, claimed) == "retrying"
    assert await history(db, claimed) == []
    assert await status_of(db, failed) == "pending"


async def test_bulk_retry_dry_run_then_for_real(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    dead_hooks = [await seed(db, f"d-{i}", status="dead", attempts=10) for i in range(3)]
    retrying = await seed(db, "r-1", status="retrying", attempts=2)
    discarded = await seed(db, "x-1", status="discarded")
    processed = await seed(db, "p-1", status="processed")
    pending = await seed(db, "n-1", status="pending")
    dead_other = await seed(db, "d-other", source="other", status="dead")
    async with admin_client(client_for) as client:
        dry = await client.post(
            "/admin/messages/retry", json={"source": "hooks", "dry_run": True}, headers=AUTH
        )
        assert dry.json() == {"matched": 4, "retried": 0}
        assert await status_of(db, dead_hooks[0]) == "dead"
        assert await db.fetchval("SELECT count(*) FROM inbox_attempts") == 0

        real = await client.post("/admin/messages/retry", json={"source": "hooks"}, headers=AUTH)
        assert real.json() == {"matched": 4, "retried": 4}
        for row_id in [*dead_hooks, retrying]:
            assert await status_of(db, row_id) == "pending"
            assert await history(db, row_id) == [
                ("admin_retry", 10 if row_id != retrying else 2, FINGERPRINT)
            ]
        assert await status_of(db, dead_other) == "dead"
        assert await status_of(db, discarded) == "discarded"
        assert await status_of(db, processed) == "processed"
        assert await status_of(db, pending) == "pending"

        named = await client.post(
            "/admin/messages/retry", json={"status": ["discarded", "pending"]}, headers=AUTH
        )
        assert named.json() == {"matched": 1, "retried": 1}
        unforced = await client.post(
            "/admin/messages/retry", json={"status": ["processed"]}, headers=AUTH
        )
        assert unforced.json() == {"matched": 0, "retried": 0}
        forced = await client.post(
            "/admin/messages/retry", json={"status": ["processed"], "force": True}, headers=AUTH
        )
        assert forced.json() == {"matched": 1, "retried": 1}
        by_id = await client.post(
            "/admin/messages/retry",
            json={"message_id": "d-other", "event_type": "nope"},
            headers=AUTH,
        )
        assert by_id.json() == {"matched": 0, "retried": 0}
        invalid = await client.post(
            "/admin/messages/retry", json={"status": ["lost"]}, headers=AUTH
        )
        assert invalid.status_code == 422
    assert await history(db, processed) == [("admin_replay", 0, FINGERPRINT)]
    assert await status_of(db, dead_other) == "dead"


async def test_bulk_retry_walks_every_batch(database_url: str, db: asyncpg.Connection) -> None:
    ids = [await seed(db, f"d-{i}", status="dead") for i in range(7)]
    busy = await seed(db, "d-busy", status="dead")
    engine = create_engine(database_url, Settings(database_url=database_url))
    try:
        # A row another transaction holds is skipped, not waited for.
        async with db.transaction():
            await db.execute("SELECT 1 FROM inbox_messages WHERE id = $1 FOR UPDATE", busy)
            result = await bulk_retry(
                engine, MessageFilter(), "token:test", force=False, dry_run=False, batch_size=2
            )
    finally:
        await engine.dispose()
    assert (result.matched, result.retried) == (8, 7)
    assert [await status_of(db, i) for i in ids] == ["pending"] * 7
    assert await status_of(db, busy) == "dead"
    assert await db.fetchval("SELECT count(*) FROM inbox_attempts") == 7
