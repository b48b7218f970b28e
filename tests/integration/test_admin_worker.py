"""The admin API and the worker together: fixed dead letters, forced replays, attempt metrics."""

from __future__ import annotations

import asyncpg
import pytest

from tests import handlers
from tests.admin_seed import last_hour
from tests.conftest import AppFactory
from tests.processing_helpers import (
    config,
    deliver_until,
    delivery,
    status_of,
    wait_until,
)

TOKEN = "admin-token-for-worker-tests"
AUTH = {"authorization": f"Bearer {TOKEN}"}


@pytest.fixture(autouse=True)
def _handlers_succeed() -> None:
    handlers.state["sync_fail"] = False


async def test_a_dead_letter_retried_after_its_cause_is_fixed_ends_processed(
    worker_for: AppFactory, db: asyncpg.Connection
) -> None:
    handlers.state["sync_fail"] = True  # the "bug": every attempt fails
    app_config = config("tests.handlers:sync_switch", max_attempts=2)
    async with worker_for(app_config, admin_tokens=[TOKEN]) as client:
        await deliver_until(client, db, "m-dead", "dead")
        dead = (await client.get("/admin/dead-letters", headers=AUTH)).json()["items"]
        assert [m["message_id"] for m in dead] == ["m-dead"]

        handlers.state["sync_fail"] = False  # the fix is deployed
        retried = await client.post(f"/admin/messages/{dead[0]['id']}/retry", headers=AUTH)
        assert retried.status_code == 200
        await wait_until(db, "SELECT status FROM inbox_messages", "processed")
        detail = (await client.get(f"/admin/messages/{dead[0]['id']}", headers=AUTH)).json()
        stats = (await client.get("/admin/stats", headers=AUTH)).json()
    assert await db.fetchval("SELECT count(*) FROM effects") == 1
    outcomes = [a["outcome"] for a in detail["attempts"]]
    assert outcomes == ["failed", "dead", "admin_retry", "processed"]
    # The worker's three attempts (two failures) and the one admin action, told apart.
    assert last_hour(stats) == (3, 2, 1)


async def test_attempt_numbers_go_on_across_admin_retries_while_the_budget_resets(
    worker_for: AppFactory, db: asyncpg.Connection
) -> None:
    handlers.state["sync_fail"] = True
    app_config = config("tests.handlers:sync_switch", max_attempts=2)
    async with worker_for(app_config, admin_tokens=[TOKEN]) as client:
        await deliver_until(client, db, "m", "dead")
        row_id = await db.fetchval("SELECT id FROM inbox_messages")
        # A second budget of two attempts, still failing: dead again after attempt 4, not 2.
        assert (await client.post(f"/admin/messages/{row_id}/retry", headers=AUTH)).is_success
        await wait_until(db, "SELECT status FROM inbox_messages", "dead")
        listed = (await client.get("/admin/dead-letters", headers=AUTH)).json()["items"]
        handlers.state["sync_fail"] = False
        assert (await client.post(f"/admin/messages/{row_id}/retry", headers=AUTH)).is_success
        await wait_until(db, "SELECT status FROM inbox_messages", "processed")
        detail = (await client.get(f"/admin/messages/{row_id}", headers=AUTH)).json()
    history = [(a["attempt"], a["outcome"]) for a in detail["attempts"]]
    assert history == [
        (1, "failed"),
        (2, "dead"),
        (2, "admin_retry"),
        (3, "failed"),
        (4, "dead"),
        (4, "admin_retry"),
        (5, "processed"),
    ]
    assert listed[0]["attempt_count"] == 2  # of the budget then running
    assert detail["attempt_count"] == 1
    assert await db.fetchval("SELECT count(*) FROM effects") == 1


async def test_a_forced_replay_runs_the_handler_again_and_unforced_is_409(
    worker_for: AppFactory, db: asyncpg.Connection
) -> None:
    async with worker_for(config("tests.handlers:record"), admin_tokens=[TOKEN]) as client:
        accepted = await client.post("/webhooks/hooks", content=b"{}", headers=delivery("m-r"))
        row_id = accepted.json()["id"]
        await wait_until(db, "SELECT count(*) FROM effects", 1)
        assert await status_of(db, "m-r") == "processed"

        unforced = await client.post(f"/admin/messages/{row_id}/retry", headers=AUTH)
        assert unforced.status_code == 409
        forced = await client.post(
            f"/admin/messages/{row_id}/retry", headers=AUTH, json={"force": True}
        )
        assert forced.status_code == 200
        await wait_until(db, "SELECT count(*) FROM effects", 2)
        assert await status_of(db, "m-r") == "processed"

        metrics = (await client.get("/metrics")).text
    processed = [
        line
        for line in metrics.splitlines()
        if line.startswith("webhook_inbox_attempts_total{") and 'outcome="processed"' in line
    ]
    assert processed, metrics
    assert float(processed[0].rsplit(" ", 1)[1]) == 2.0
