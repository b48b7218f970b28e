"""The admin API's breakdowns behind the console's overview: activity per minute, dead letters
by error type, and the error-type filter that retries one such group."""

from __future__ import annotations

from datetime import datetime, timedelta

import asyncpg

from tests.admin_seed import AUTH, CONFIG, TOKEN, seed, status_of
from tests.conftest import AppFactory


async def attempt(
    db: asyncpg.Connection,
    message: int,
    outcome: str,
    started_at: datetime | None = None,
    error_type: str | None = None,
) -> None:
    """One history row; `started_at` defaults to now."""
    await db.execute(
        """
        INSERT INTO inbox_attempts (message_id, attempt, started_at, finished_at, outcome,
                                    error_type, error)
        VALUES ($1, 1, coalesce($2, now()), coalesce($2, now()), $3, $4,
                CASE WHEN $4::text IS NULL THEN NULL ELSE 'it failed' END)
        """,
        message,
        started_at,
        outcome,
        error_type,
    )


async def test_activity_counts_receipts_and_attempts_in_their_minute(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    minute: datetime = await db.fetchval("SELECT date_trunc('minute', now())")
    two_ago = minute - timedelta(minutes=2)
    first = await seed(db, "a", received_at=two_ago + timedelta(seconds=5))
    await seed(db, "b", received_at=two_ago + timedelta(seconds=50))
    await seed(db, "c", received_at=minute)
    await seed(db, "too-old", received_at=minute - timedelta(minutes=90))
    await attempt(db, first, "failed", two_ago + timedelta(seconds=6), "ValueError")
    await attempt(db, first, "retry_later", two_ago + timedelta(seconds=7), "RetryLater")
    await attempt(db, first, "processed", two_ago + timedelta(seconds=8))
    await attempt(db, first, "skipped", two_ago + timedelta(seconds=9))
    await attempt(db, first, "dead", minute, "ValueError")
    await attempt(db, first, "admin_retry", minute)  # an action, not an attempt
    await attempt(db, first, "processed", minute - timedelta(minutes=61))  # outside the hour
    async with client_for(CONFIG, admin_tokens=[TOKEN]) as client:
        response = await client.get("/admin/stats/activity", headers=AUTH)
    assert response.status_code == 200
    minutes = response.json()["minutes"]
    # The window may have moved on by a minute since `minute` was read; keys do not.
    assert len(minutes) == 60
    by_minute = {datetime.fromisoformat(m["minute"]): m for m in minutes}
    assert by_minute[two_ago] == {
        "minute": by_minute[two_ago]["minute"],
        "received": 2,
        "processed": 2,
        "failed": 2,
    }
    assert (by_minute[minute]["received"], by_minute[minute]["failed"]) == (1, 1)
    assert by_minute[minute]["processed"] == 0
    assert sum(m["received"] for m in minutes) == 3
    assert sum(m["processed"] for m in minutes) == 2
    steps = {b - a for a, b in zip(by_minute, list(by_minute)[1:], strict=False)}
    assert steps == {timedelta(minutes=1)}


async def test_activity_window_is_bounded(client_for: AppFactory) -> None:
    async with client_for(CONFIG, admin_tokens=[TOKEN]) as client:
        one = await client.get("/admin/stats/activity?minutes=1", headers=AUTH)
        day = await client.get("/admin/stats/activity?minutes=1440", headers=AUTH)
        none = await client.get("/admin/stats/activity?minutes=0", headers=AUTH)
        too_many = await client.get("/admin/stats/activity?minutes=1441", headers=AUTH)
    assert one.json()["minutes"] == [
        {"minute": one.json()["minutes"][0]["minute"], "received": 0, "processed": 0, "failed": 0}
    ]
    assert len(day.json()["minutes"]) == 1440
    assert none.status_code == too_many.status_code == 422


async def test_dead_letters_are_grouped_by_their_latest_failure(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    timeouts = []
    for i in range(3):
        row = await seed(db, f"t-{i}", status="dead", source="hooks" if i else "other")
        await attempt(db, row, "failed", error_type="ValueError")  # an earlier, other failure
        await attempt(db, row, "dead", error_type="TimeoutError")
        await attempt(db, row, "admin_discard")  # actions record no error type
        timeouts.append(row)
    value_error = await seed(db, "v-0", status="dead", last_error="ValueError: bad amount")
    await attempt(db, value_error, "dead", error_type="ValueError")
    await seed(db, "u-0", status="dead")  # no failed attempt on record
    retrying = await seed(db, "r-0", status="retrying")
    await attempt(db, retrying, "failed", error_type="TimeoutError")
    async with client_for(CONFIG, admin_tokens=[TOKEN]) as client:
        response = await client.get("/admin/dead-letters/groups", headers=AUTH)
        only_hooks = await client.get("/admin/dead-letters/groups?source=hooks", headers=AUTH)
    assert response.status_code == 200
    groups = response.json()["groups"]
    assert [(g["error_type"], g["count"], g["sources"]) for g in groups] == [
        ("TimeoutError", 3, ["hooks", "other"]),
        ("ValueError", 1, ["hooks"]),
        (None, 1, ["hooks"]),
    ]
    assert groups[1]["latest_error"] == "ValueError: bad amount"
    assert groups[0]["oldest_received_at"] <= groups[0]["newest_received_at"]
    assert [g["count"] for g in only_hooks.json()["groups"]] == [2, 1, 1]


async def test_the_error_type_filter_lists_and_retries_one_group(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    timeouts = []
    for i in range(2):
        row = await seed(db, f"t-{i}", status="dead")
        await attempt(db, row, "dead", error_type="TimeoutError")
        timeouts.append(row)
    other = await seed(db, "v-0", status="dead")
    await attempt(db, other, "dead", error_type="ValueError")
    body = {"status": ["dead"], "error_type": "TimeoutError"}
    async with client_for(CONFIG, admin_tokens=[TOKEN]) as client:
        listed = await client.get("/admin/dead-letters?error_type=TimeoutError", headers=AUTH)
        counted = await client.post(
            "/admin/messages/retry", headers=AUTH, json={**body, "dry_run": True}
        )
        retried = await client.post("/admin/messages/retry", headers=AUTH, json=body)
    assert sorted(m["id"] for m in listed.json()["items"]) == timeouts
    assert counted.json() == {"matched": 2, "retried": 0}
    assert retried.json() == {"matched": 2, "retried": 2}
    assert [await status_of(db, row) for row in timeouts] == ["pending", "pending"]
    assert await status_of(db, other) == "dead"
