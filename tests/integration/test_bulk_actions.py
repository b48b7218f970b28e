"""Bulk actions over a search: each action changes exactly the matches, a dry run nothing, the
audit keeps the query and the progress, and an interrupted action resumes exactly the rest."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from service.core.db import create_engine
from service.core.settings import Settings
from service.core.status import BulkAction
from service.store import bulk
from service.store.admin import MessageFilter
from service.store.bulk import BulkActionRow, BulkRequest
from tests.admin_seed import AUTH, CONFIG, TOKEN, seed, status_of
from tests.conftest import AppFactory


@pytest.fixture
async def engine(database_url: str) -> AsyncIterator[AsyncEngine]:
    engine = create_engine(database_url, Settings(database_url=database_url))
    yield engine
    await engine.dispose()


async def finished(client: httpx.AsyncClient, action_id: int) -> dict[str, Any]:
    """The action once its background run has finished."""
    for _ in range(200):
        shown = (await client.get(f"/admin/messages/actions/{action_id}", headers=AUTH)).json()
        if shown["status"] == "finished":
            return dict(shown)
        await asyncio.sleep(0.05)
    raise AssertionError(f"bulk action {action_id} did not finish: {shown}")


async def act(client: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    started = await client.post("/admin/messages/actions", json=body, headers=AUTH)
    assert started.status_code == 202, started.text
    return await finished(client, started.json()["id"])


async def outcomes(db: asyncpg.Connection) -> list[tuple[int, str]]:
    rows = await db.fetch("SELECT message_id, outcome FROM inbox_attempts ORDER BY message_id, id")
    return [(r["message_id"], r["outcome"]) for r in rows]


async def test_each_action_changes_exactly_the_messages_its_search_matches(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    dead = [await seed(db, f"d-{i}", status="dead", event_type="charge.failed") for i in range(3)]
    dead_other_type = await seed(db, "d-x", status="dead", event_type="refund.failed")
    processed = await seed(db, "p-1", status="processed", event_type="charge.failed")
    pending = await seed(db, "n-1", status="pending", event_type="charge.failed")
    dead_other_source = await seed(db, "d-o", source="other", status="dead")
    routed = await seed(db, "r-1", source="routed", status="processed")
    async with client_for(CONFIG, admin_tokens=[TOKEN]) as client:
        retried = await act(client, action="retry", source="hooks", event_type="charge.*")
        assert (retried["matched"], retried["done"]) == (3, 3)
        assert [await status_of(db, i) for i in dead] == ["pending"] * 3
        assert await status_of(db, dead_other_type) == "dead"
        assert await status_of(db, processed) == "processed"

        replayed = await act(client, action="replay", source="hooks", status=["processed"])
        assert (replayed["matched"], replayed["done"]) == (1, 1)
        assert await status_of(db, processed) == "pending"

        discarded = await act(client, action="discard", source="hooks", status=["pending", "dead"])
        assert (discarded["matched"], discarded["done"]) == (6, 6)
        for message in [*dead, dead_other_type, processed, pending]:
            assert await status_of(db, message) == "discarded"
        assert await status_of(db, dead_other_source) == "dead"

        to_billing = await act(
            client, action="replay_destination", source="routed", destination="billing"
        )
        assert (to_billing["matched"], to_billing["done"]) == (1, 1)
        assert (
            await db.fetchval(
                "SELECT status FROM inbox_destinations WHERE message_id = $1 AND destination = $2",
                routed,
                "billing",
            )
            == "pending"
        )
    assert await status_of(db, dead_other_source) == "dead"
    # Each message changed once per action that matched it, recorded as one message's would be.
    history: dict[int, list[str]] = {}
    for message, outcome in await outcomes(db):
        history.setdefault(message, []).append(outcome)
    assert history == {
        **{i: ["admin_retry", "admin_discard"] for i in dead},
        processed: ["admin_replay", "admin_discard"],
        dead_other_type: ["admin_discard"],
        pending: ["admin_discard"],
        routed: ["admin_replay"],
    }


async def test_a_dry_run_counts_and_changes_or_records_nothing(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    failed = [await seed(db, f"d-{i}", status="dead") for i in range(4)]
    async with client_for(CONFIG, admin_tokens=[TOKEN]) as client:
        for action in ("retry", "replay", "discard"):
            dry = await client.post(
                "/admin/messages/actions", json={"action": action, "dry_run": True}, headers=AUTH
            )
            assert dry.status_code == 200, dry.text
            assert dry.json() == {"matched": 4}
        audit = await client.get("/admin/messages/actions", headers=AUTH)
    assert audit.json() == {"items": []}
    assert [await status_of(db, i) for i in failed] == ["dead"] * 4
    assert await db.fetchval("SELECT count(*) FROM inbox_attempts") == 0
    assert await db.fetchval("SELECT count(*) FROM inbox_bulk_actions") == 0


async def test_the_audit_keeps_the_query_as_given_and_who_ran_it(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    await seed(db, "d-1", status="dead", event_type="charge.failed")
    async with client_for(CONFIG, admin_tokens=[TOKEN]) as client:
        done = await act(
            client,
            action="discard",
            source="hooks",
            event_type="charge.*",
            received_after="2020-01-01T00:00:00Z",
            status=["dead"],
        )
        unknown_destination = await client.post(
            "/admin/messages/actions",
            json={"action": "replay_destination", "source": "routed", "destination": "nope"},
            headers=AUTH,
        )
        destination_without_replay = await client.post(
            "/admin/messages/actions",
            json={"action": "retry", "destination": "billing"},
            headers=AUTH,
        )
        audit = (await client.get("/admin/messages/actions", headers=AUTH)).json()
    assert unknown_destination.status_code == 404
    assert unknown_destination.headers["content-type"] == "application/problem+json"
    assert destination_without_replay.status_code == 422
    assert audit["items"] == [done]
    assert done["query"] == {
        "source": "hooks",
        "event_type": "charge.*",
        "received_after": "2020-01-01T00:00:00Z",
        "status": ["dead"],
    }
    assert done["action"] == "discard"
    assert done["actor"].startswith("token:")
    assert done["after_id"] == done["last_id"]
    assert done["finished_at"] is not None


async def cancelled_after_first_batch(
    engine: AsyncEngine, action: BulkActionRow, request: BulkRequest
) -> None:
    """Run `action` in batches of 2 and cancel its runner once the first has committed, as
    shutdown or Ctrl-C does."""
    first = asyncio.Event()

    async def told(progress: BulkActionRow) -> None:
        first.set()
        await asyncio.sleep(3600)  # the cancellation comes here

    runner = asyncio.create_task(bulk.run(engine, action, request, batch_size=2, on_progress=told))
    await first.wait()
    runner.cancel()
    with pytest.raises(asyncio.CancelledError):
        await runner


async def test_an_interrupted_action_resumed_does_exactly_the_rest_once(
    client_for: AppFactory, db: asyncpg.Connection, engine: AsyncEngine
) -> None:
    failed = [await seed(db, f"d-{i}", status="dead") for i in range(5)]
    request = BulkRequest(BulkAction.RETRY, MessageFilter(source="hooks"))
    action = await bulk.start(engine, request, {"source": "hooks"}, "token:test")
    await cancelled_after_first_batch(engine, action, request)

    stopped = await bulk.get(engine, action.id)
    assert (stopped.status, stopped.matched, stopped.done) == ("interrupted", 5, 2)
    assert stopped.after_id == failed[1]
    assert [await status_of(db, i) for i in failed] == ["pending"] * 2 + ["dead"] * 3

    async with client_for(CONFIG, admin_tokens=[TOKEN]) as client:
        resumed = await client.post(f"/admin/messages/actions/{action.id}/resume", headers=AUTH)
        assert resumed.status_code == 202, resumed.text
        done = await finished(client, action.id)
        again = await client.post(f"/admin/messages/actions/{action.id}/resume", headers=AUTH)
        unknown = await client.post("/admin/messages/actions/999999/resume", headers=AUTH)
    assert (done["matched"], done["done"]) == (5, 5)
    assert [await status_of(db, i) for i in failed] == ["pending"] * 5
    assert await outcomes(db) == [(i, "admin_retry") for i in failed]
    assert again.status_code == 409
    assert "finished" in again.json()["detail"]
    assert unknown.status_code == 404


async def test_an_action_whose_runner_died_is_resumed_and_a_live_one_is_not(
    client_for: AppFactory, db: asyncpg.Connection, engine: AsyncEngine
) -> None:
    failed = [await seed(db, f"d-{i}", status="dead") for i in range(3)]
    request = BulkRequest(BulkAction.DISCARD, MessageFilter())
    action = await bulk.start(engine, request, {}, "token:test")
    async with client_for(CONFIG, admin_tokens=[TOKEN]) as client:
        # Just started, as a runner that is alive left it: refused.
        alive = await client.post(f"/admin/messages/actions/{action.id}/resume", headers=AUTH)
        assert alive.status_code == 409
        assert "running" in alive.json()["detail"]
        # As a runner killed after its first batch leaves it: running, its heartbeat stale.
        await db.execute("UPDATE inbox_messages SET status = 'discarded' WHERE id = $1", failed[0])
        await db.execute(
            "UPDATE inbox_bulk_actions SET after_id = $2, done = 1,"
            " updated_at = now() - interval '1 minute' WHERE id = $1",
            action.id,
            failed[0],
        )
        resumed = await client.post(f"/admin/messages/actions/{action.id}/resume", headers=AUTH)
        assert resumed.status_code == 202, resumed.text
        done = await finished(client, action.id)
    assert (done["matched"], done["done"]) == (3, 3)
    assert [await status_of(db, i) for i in failed] == ["discarded"] * 3
    # The first message was the dead runner's: the resumed walk did not take it again.
    assert await outcomes(db) == [(i, "admin_discard") for i in failed[1:]]


async def test_a_runner_taken_over_commits_no_batch(
    db: asyncpg.Connection, engine: AsyncEngine
) -> None:
    failed = [await seed(db, f"d-{i}", status="dead") for i in range(3)]
    request = BulkRequest(BulkAction.RETRY, MessageFilter())
    action = await bulk.start(engine, request, {}, "token:test")
    # Another runner walked it meanwhile: this one's position is behind the row's.
    await db.execute(
        "UPDATE inbox_bulk_actions SET after_id = $2 WHERE id = $1", action.id, failed[0]
    )
    ended = await bulk.run(engine, action, request, batch_size=2)
    assert ended.status == "running"
    assert [await status_of(db, i) for i in failed] == ["dead"] * 3
    assert await db.fetchval("SELECT count(*) FROM inbox_attempts") == 0


async def test_shutdown_leaves_a_running_action_interrupted(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    message = await seed(db, "r-1", source="routed", status="dead")
    await db.execute(
        "INSERT INTO inbox_destinations (message_id, destination, source, status)"
        " VALUES ($1, 'billing', 'routed', 'dead')",
        message,
    )
    # The batch's retry of the message's destination waits for this lock, until shutdown.
    async with db.transaction():
        await db.execute(
            "SELECT 1 FROM inbox_destinations WHERE message_id = $1 FOR UPDATE", message
        )
        async with client_for(CONFIG, admin_tokens=[TOKEN]) as client:
            started = await client.post(
                "/admin/messages/actions", json={"action": "retry"}, headers=AUTH
            )
            assert started.status_code == 202, started.text
            await asyncio.sleep(0.3)
    row = await db.fetchrow("SELECT * FROM inbox_bulk_actions WHERE id = $1", started.json()["id"])
    assert (row["status"], row["matched"], row["done"], row["after_id"]) == (
        "interrupted",
        1,
        0,
        0,
    )
    assert json.loads(row["query"]) == {}
    # Its batch rolled back: nothing of it committed.
    assert await status_of(db, message) == "dead"
    assert await outcomes(db) == []
