"""Named destinations (issue 51): each destination of a message has its own attempts, status
and dead letters; one that fails is retried alone, one that is done never runs again."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from tests import handlers
from tests.admin_seed import AUTH, TOKEN
from tests.cli_runner import cli
from tests.conftest import AppFactory
from tests.processing_helpers import delivery, source, wait_until

BILLING = {"handlers": ["tests.handlers:record_billing"]}
WAREHOUSE = {"handlers": ["tests.handlers:record_warehouse"]}


def fanned(**destinations: dict[str, Any]) -> dict[str, Any]:
    return {"sources": {"hooks": source(destinations=destinations)}}


async def effects_by(db: asyncpg.Connection) -> list[tuple[str, str, int]]:
    rows = await db.fetch("SELECT message_id, payload, attempt FROM effects ORDER BY id")
    return sorted((r["message_id"], json.loads(r["payload"])["by"], r["attempt"]) for r in rows)


async def destination_states(db: asyncpg.Connection, message_id: str) -> dict[str, Any]:
    rows = await db.fetch(
        "SELECT d.destination, d.status, d.attempts FROM inbox_destinations d "
        "JOIN inbox_messages m ON m.id = d.message_id WHERE m.message_id = $1",
        message_id,
    )
    return {r["destination"]: (r["status"], r["attempts"]) for r in rows}


async def destination_attempts(db: asyncpg.Connection, message_id: str) -> list[tuple[Any, ...]]:
    rows = await db.fetch(
        "SELECT a.destination, a.attempt, a.outcome FROM inbox_attempts a "
        "JOIN inbox_messages m ON m.id = a.message_id WHERE m.message_id = $1 ORDER BY a.id",
        message_id,
    )
    return [tuple(r) for r in rows]


async def assert_each_applied_once(db: asyncpg.Connection, disputes_attempt: int) -> None:
    """m-1 processed by its three destinations, each applying its effect once: billing and
    warehouse on their first attempt, disputes on attempt `disputes_attempt`."""
    assert await effects_by(db) == [
        ("m-1", "billing", 1),
        ("m-1", "disputes", disputes_attempt),
        ("m-1", "warehouse", 1),
    ]
    assert await destination_states(db, "m-1") == {
        "billing": ("processed", 1),
        "disputes": ("processed", disputes_attempt),
        "warehouse": ("processed", 1),
    }


async def test_a_failing_destination_is_retried_alone_and_every_effect_applies_once(
    worker_for: AppFactory, db: asyncpg.Connection
) -> None:
    config = fanned(
        billing=BILLING,
        disputes={"handlers": ["tests.handlers:record_disputes_failing_three_times"]},
        warehouse=WAREHOUSE,
    )
    async with worker_for(config) as client:
        sent = await client.post("/webhooks/hooks", content=b"{}", headers=delivery("m-1"))
        assert sent.status_code == 200
        await wait_until(db, "SELECT status FROM inbox_messages", "processed")
        metrics = (await client.get("/metrics")).text
    counted = {
        line.split("{", 1)[1].rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("webhook_inbox_destination_attempts_total{")
    }
    assert {labels: n for labels, n in counted.items() if 'source="hooks"' in labels} == {
        'destination="billing",outcome="processed",source="hooks"}': 1.0,
        'destination="disputes",outcome="failed",source="hooks"}': 3.0,
        'destination="disputes",outcome="processed",source="hooks"}': 1.0,
        'destination="warehouse",outcome="processed",source="hooks"}': 1.0,
    }
    await assert_each_applied_once(db, disputes_attempt=4)
    assert await destination_attempts(db, "m-1") == [
        ("billing", 1, "processed"),
        ("disputes", 1, "failed"),
        ("warehouse", 1, "processed"),
        ("disputes", 2, "failed"),
        ("disputes", 3, "failed"),
        ("disputes", 4, "processed"),
    ]
    assert await db.fetchval("SELECT attempts FROM inbox_messages") == 4


DISPUTES_UNLESS_DOWN = {"handlers": ["tests.handlers:record_disputes_unless_down"]}


async def message_row_id(db: asyncpg.Connection, message_id: str) -> int:
    row_id: int = await db.fetchval(
        "SELECT id FROM inbox_messages WHERE message_id = $1", message_id
    )
    return row_id


async def on_destination(
    client: httpx.AsyncClient, row_id: int, destination: str, action: str
) -> httpx.Response:
    """POST /admin/messages/{id}/destinations/{name}/`action` (retry or discard)."""
    return await client.post(
        f"/admin/messages/{row_id}/destinations/{destination}/{action}", headers=AUTH
    )


async def test_a_dead_destination_is_retried_alone_from_the_admin_api(
    worker_for: AppFactory, db: asyncpg.Connection
) -> None:
    config = fanned(billing=BILLING, disputes=DISPUTES_UNLESS_DOWN, warehouse=WAREHOUSE)
    config["sources"]["hooks"]["max_attempts"] = 2
    handlers.state["disputes_down"] = True
    try:
        async with worker_for(config, admin_tokens=[TOKEN]) as client:
            await client.post("/webhooks/hooks", content=b"{}", headers=delivery("m-1"))
            await wait_until(db, "SELECT status FROM inbox_messages", "dead")
            row_id = await message_row_id(db, "m-1")
            detail = (await client.get(f"/admin/messages/{row_id}", headers=AUTH)).json()
            assert [(d["name"], d["status"], d["attempts"]) for d in detail["destinations"]] == [
                ("billing", "processed", 1),
                ("disputes", "dead", 2),
                ("warehouse", "processed", 1),
            ]
            assert detail["last_error"].startswith("destination disputes: RuntimeError")
            counts = (await client.get("/admin/destinations", headers=AUTH)).json()
            assert {d["destination"]: d["counts"] for d in counts["destinations"]} == {
                "billing": {"processed": 1},
                "disputes": {"dead": 1},
                "warehouse": {"processed": 1},
            }

            handlers.state["disputes_down"] = False
            unknown = await on_destination(client, row_id, "nowhere", "retry")
            done = await on_destination(client, row_id, "billing", "retry")
            retried = await on_destination(client, row_id, "disputes", "retry")
            assert retried.status_code == 200, retried.text
            assert retried.json()["action"] == "admin_retry"
            await wait_until(db, "SELECT status FROM inbox_messages", "processed")
    finally:
        handlers.state.pop("disputes_down", None)
    assert unknown.status_code == 404
    assert "has no destination nowhere" in unknown.json()["detail"]
    assert done.status_code == 409  # processed: a replay needs force
    await assert_each_applied_once(db, disputes_attempt=3)
    history = await destination_attempts(db, "m-1")
    assert history[-2:] == [("disputes", 2, "admin_retry"), ("disputes", 3, "processed")]


async def test_a_destination_added_later_gets_older_messages_only_when_replayed_to_it(
    worker_for: AppFactory, db: asyncpg.Connection
) -> None:
    async with worker_for(fanned(billing=BILLING)) as client:
        for i in range(3):
            await client.post("/webhooks/hooks", content=b"{}", headers=delivery(f"old-{i}"))
        await wait_until(db, "SELECT count(*) FROM inbox_messages WHERE status = 'processed'", 3)
    config = fanned(billing=BILLING, warehouse=WAREHOUSE)
    async with worker_for(config, admin_tokens=[TOKEN]) as client:
        await client.post("/webhooks/hooks", content=b"{}", headers=delivery("new"))
        await wait_until(db, "SELECT count(*) FROM effects", 5)
        path = "/admin/sources/hooks/destinations/warehouse/replay"
        dry = await client.post(path, json={"dry_run": True}, headers=AUTH)
        before = await client.post(
            path,
            json={"received_before": "2000-01-01T00:00:00Z", "dry_run": True},
            headers=AUTH,
        )
        missing = await client.post(
            "/admin/sources/hooks/destinations/nowhere/replay", json={}, headers=AUTH
        )
        bad = await client.post(path, json={"received_before": 1700000000}, headers=AUTH)
        assert await effects_by(db) == [
            ("new", "billing", 1),
            ("new", "warehouse", 1),
            ("old-0", "billing", 1),
            ("old-1", "billing", 1),
            ("old-2", "billing", 1),
        ]
        real = await client.post(
            path, json={"status": ["processed"], "event_type": "order.*"}, headers=AUTH
        )
        await wait_until(db, "SELECT count(*) FROM effects", 9)
        await wait_until(db, "SELECT count(*) FROM inbox_messages WHERE status = 'processed'", 4)
    assert dry.json() == {"matched": 4, "retried": 0}
    assert before.json() == {"matched": 0, "retried": 0}
    assert missing.status_code == 404
    assert bad.status_code == 422
    assert real.json() == {"matched": 4, "retried": 4}
    by = await effects_by(db)
    # Each old message got warehouse once; billing did not run again; `new` had both once
    # and its warehouse replay is a second, asked-for run.
    assert [e for e in by if e[1] == "billing"] == [
        ("new", "billing", 1),
        ("old-0", "billing", 1),
        ("old-1", "billing", 1),
        ("old-2", "billing", 1),
    ]
    assert sorted(e[0] for e in by if e[1] == "warehouse") == [
        "new",
        "new",
        "old-0",
        "old-1",
        "old-2",
    ]


async def test_discarding_the_dead_destination_sets_the_message_aside_and_nothing_else(
    worker_for: AppFactory, db: asyncpg.Connection
) -> None:
    config = fanned(billing=BILLING, disputes={"handlers": ["tests.handlers:always_fail"]})
    config["sources"]["hooks"]["max_attempts"] = 1
    async with worker_for(config, admin_tokens=[TOKEN]) as client:
        await client.post("/webhooks/hooks", content=b"{}", headers=delivery("m-1"))
        await wait_until(db, "SELECT status FROM inbox_messages", "dead")
        row_id = await message_row_id(db, "m-1")
        processed = await on_destination(client, row_id, "billing", "discard")
        discarded = await on_destination(client, row_id, "disputes", "discard")
        again = await on_destination(client, row_id, "disputes", "discard")
        # The whole message's retry runs what is not processed: disputes, not billing.
        retried = await client.post(f"/admin/messages/{row_id}/retry", headers=AUTH)
        await wait_until(db, "SELECT status FROM inbox_messages", "dead")
    assert processed.status_code == 409
    assert (discarded.json()["status"], discarded.json()["action"]) == (
        "discarded",
        "admin_discard",
    )
    assert again.json()["action"] == "none"
    assert retried.json()["action"] == "admin_retry"
    assert await destination_states(db, "m-1") == {
        "billing": ("processed", 1),
        "disputes": ("dead", 2),
    }
    assert [e[1] for e in await effects_by(db)] == ["billing"]


SOURCES_TOML = """
[sources.hooks]
kind = "generic"
id_header = "X-Message-Id"
[sources.hooks.destinations.billing]
handlers = ["tests.handlers:record_billing"]
[sources.hooks.destinations.disputes]
handlers = ["tests.handlers:record_disputes_unless_down"]
"""


async def test_the_command_line_retries_one_destination_and_counts_them(
    worker_for: AppFactory,
    db: asyncpg.Connection,
    database_url: str,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    config = fanned(billing=BILLING, disputes=DISPUTES_UNLESS_DOWN)
    config["sources"]["hooks"]["max_attempts"] = 1
    (tmp_path / "inbox.toml").write_text(SOURCES_TOML)
    monkeypatch.setenv("INBOX_CONFIG", str(tmp_path / "inbox.toml"))
    handlers.state["disputes_down"] = True
    try:
        async with worker_for(config) as client:
            await client.post("/webhooks/hooks", content=b"{}", headers=delivery("m-1"))
            await wait_until(db, "SELECT status FROM inbox_messages", "dead")
    finally:
        handlers.state.pop("disputes_down", None)
    row_id = await message_row_id(db, "m-1")
    shown = await cli(monkeypatch, database_url, "messages", "show", str(row_id))
    assert "disputes  dead" in shown.out.replace("   ", "  ")
    counted = await cli(monkeypatch, database_url, "destinations", "--json")
    assert {d["destination"]: d["counts"] for d in counted.json()["destinations"]} == {
        "billing": {"processed": 1},
        "disputes": {"dead": 1},
    }
    unknown = await cli(
        monkeypatch, database_url, "messages", "retry", str(row_id), "--destination", "nowhere"
    )
    retried = await cli(
        monkeypatch, database_url, "messages", "retry", str(row_id), "--destination", "disputes"
    )
    assert unknown.status == 1
    assert "has no destination nowhere" in unknown.err
    assert retried.status == 0, retried.err
    assert "destination disputes: admin_retry, message now pending" in retried.out
    async with worker_for(config):
        await wait_until(db, "SELECT status FROM inbox_messages", "processed")
    assert [e[1] for e in await effects_by(db)] == ["billing", "disputes"]
    replayed = await cli(
        monkeypatch,
        database_url,
        "messages",
        "replay-to",
        "billing",
        "--source",
        "hooks",
        "--dry-run",
    )
    assert (replayed.status, replayed.out.split()[0]) == (0, "1")


async def test_a_message_no_destination_wants_is_processed_with_a_note_the_admin_shows(
    worker_for: AppFactory, db: asyncpg.Connection
) -> None:
    config = fanned(
        billing={"event_types": ["invoice.*"], **BILLING},
        warehouse={"payload": {"contains": {"livemode": True}}, **WAREHOUSE},
    )
    async with worker_for(config, admin_tokens=[TOKEN]) as client:
        await client.post(
            "/webhooks/hooks",
            content=b'{"livemode": false}',
            headers=delivery("m-1", "payout.paid"),
        )
        await wait_until(db, "SELECT status FROM inbox_messages", "processed")
        row_id = await message_row_id(db, "m-1")
        detail = (await client.get(f"/admin/messages/{row_id}", headers=AUTH)).json()
    assert detail["destinations"] == []
    assert [(a["outcome"], a["error"], a["destination"]) for a in detail["attempts"]] == [
        ("skipped", "no destination matched; processed without effect", None)
    ]
    assert await effects_by(db) == []
