"""Admin auth on every route, statistics against the table, and the sources listing."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from tests.admin_seed import ADMIN_ROUTES, AUTH, CONFIG, TOKEN, last_hour, seed, seed_attempt
from tests.conftest import AppFactory


@pytest.mark.parametrize(
    "authorization",
    [None, "Bearer wrong-token", f"Basic {TOKEN}", TOKEN, "Bearer ", f"bearer {TOKEN}x"],
)
async def test_every_admin_route_is_401_without_a_valid_bearer(
    client_for: AppFactory, db: asyncpg.Connection, authorization: str | None
) -> None:
    message = await seed(db, "m-1", status="dead")
    headers = {} if authorization is None else {"Authorization": authorization}
    async with client_for(CONFIG, admin_tokens=[TOKEN]) as client:
        for method, path in ADMIN_ROUTES:
            response = await client.request(
                method, path.replace("/1", f"/{message}"), headers=headers, json={}
            )
            assert response.status_code == 401, (method, path)
            assert response.headers["content-type"] == "application/problem+json"
            assert response.headers["www-authenticate"].startswith("Bearer")
            assert response.json()["status"] == 401
            assert TOKEN not in response.text
    assert await db.fetchval("SELECT status FROM inbox_messages") == "dead"


async def test_any_configured_token_works_and_the_scheme_is_case_insensitive(
    client_for: AppFactory,
) -> None:
    async with client_for(CONFIG, admin_tokens=["first-token", TOKEN]) as client:
        second = await client.get("/admin/stats", headers=AUTH)
        first = await client.get("/admin/stats", headers={"Authorization": "bearer first-token"})
    assert second.status_code == 200
    assert first.status_code == 200


async def test_generated_token_is_used_when_none_is_configured(
    client_for: AppFactory, data_dir: Path
) -> None:
    async with client_for(CONFIG) as client:
        token = (data_dir / "admin-token").read_text().strip()
        ok = await client.get("/admin/sources", headers={"Authorization": f"Bearer {token}"})
        wrong = await client.get("/admin/sources", headers=AUTH)
    assert (data_dir / "admin-token").stat().st_mode & 0o777 == 0o600
    assert ok.status_code == 200
    assert wrong.status_code == 401


async def test_stats_agree_with_the_table(client_for: AppFactory, db: asyncpg.Connection) -> None:
    layout: list[tuple[str, str, timedelta]] = [
        ("hooks", "pending", timedelta(minutes=30)),
        ("hooks", "pending", timedelta(minutes=5)),
        ("hooks", "retrying", timedelta(hours=2)),
        ("hooks", "dead", timedelta(days=3)),
        ("hooks", "processed", timedelta(days=9)),
        ("other", "processed", timedelta(hours=1)),
        ("other", "processing", timedelta(minutes=10)),
        ("gone", "discarded", timedelta(days=1)),
    ]
    ids = [
        await seed(db, f"m-{i}", source=source, status=status, age=age)
        for i, (source, status, age) in enumerate(layout)
    ]
    await seed_attempt(db, ids[2], 1, "retrying", error="boom")
    await seed_attempt(db, ids[2], 2, "retrying", error="boom", age=timedelta(minutes=50))
    await seed_attempt(db, ids[4], 1, "processed")
    await seed_attempt(db, ids[3], 1, "dead", error="old", age=timedelta(hours=2))
    await seed_attempt(db, ids[3], 1, "admin_retry", actor="token:abc")
    async with client_for(CONFIG, admin_tokens=[TOKEN]) as client:
        stats = (await client.get("/admin/stats", headers=AUTH)).json()
    table = await db.fetch("SELECT source, status, count(*) AS n FROM inbox_messages GROUP BY 1, 2")
    assert stats["total"] == await db.fetchval("SELECT count(*) FROM inbox_messages")
    expected_by_status = dict.fromkeys(
        ["pending", "processing", "processed", "retrying", "dead", "discarded"], 0
    )
    for row in table:
        expected_by_status[row["status"]] += row["n"]
    assert stats["by_status"] == expected_by_status
    by_source = {s["source"]: s for s in stats["sources"]}
    assert sorted(by_source) == ["gone", "hooks", "other"]
    for row in table:
        assert by_source[row["source"]]["counts"][row["status"]] == row["n"]
    assert by_source["hooks"]["total"] == 5
    # The oldest unfinished message is the retrying one, two hours old.
    assert 7100 < stats["oldest_pending_age_seconds"] < 7300
    assert 7100 < by_source["hooks"]["oldest_pending_age_seconds"] < 7300
    assert 500 < by_source["other"]["oldest_pending_age_seconds"] < 700
    assert by_source["gone"]["oldest_pending_age_seconds"] is None
    assert last_hour(stats) == (3, 2, 1)


async def test_stats_show_the_backlog_its_rates_and_the_time_left(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    # 80 messages drained in the last 10 s (and 20 an hour ago), 10 received in them; 120
    # pending, 110 of them from an outage an hour ago: the backlog shrinks by 7 a second.
    old = [await seed(db, f"old-{i}", status="pending", age=timedelta(hours=1)) for i in range(110)]
    for i in range(10):
        await seed(db, f"new-{i}", status="pending")
    for i in range(100):
        done = await seed(db, f"done-{i}", status="processed", age=timedelta(hours=2))
        ago = timedelta(seconds=2) if i < 80 else timedelta(minutes=50)
        await seed_attempt(db, done, 1, "processed", age=ago)
    await seed_attempt(db, old[0], 1, "retrying", error="boom")  # a failure: not drained
    async with client_for(CONFIG, admin_tokens=[TOKEN]) as client:
        stats = (await client.get("/admin/stats", headers=AUTH)).json()
        await db.execute("UPDATE inbox_messages SET status = 'processed' WHERE status = 'pending'")
        done = (await client.get("/admin/stats", headers=AUTH)).json()
    assert stats["backlog"] == 120
    assert stats["drain_rate_per_second"] == 8.0
    assert stats["arrival_rate_per_second"] == 1.0
    assert stats["catch_up_seconds"] == 120 / 7
    assert (done["backlog"], done["catch_up_seconds"]) == (0, 0.0)


async def test_stats_of_an_empty_inbox(client_for: AppFactory) -> None:
    async with client_for({}, admin_tokens=[TOKEN]) as client:
        stats = (await client.get("/admin/stats", headers=AUTH)).json()
    assert stats["total"] == 0
    assert stats["sources"] == []
    assert stats["oldest_pending_age_seconds"] is None
    assert (stats["backlog"], stats["drain_rate_per_second"]) == (0, 0.0)
    assert stats["catch_up_seconds"] == 0.0


async def test_sources_describe_config_without_secrets(
    client_for: AppFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOOK_SECRET", "super-secret-hmac-key")
    config: dict[str, Any] = {
        "sources": {
            "signed": {
                "kind": "generic",
                "secrets": ["env:HOOK_SECRET"],
                "token": "shared-query-token-value",
                "id_header": "X-Id",
                "hmac": {"header": "X-Sig"},
                "mode": "sync",
                "max_attempts": 4,
                "handlers": ["tests.handlers:record"],
                "handler": [{"target": "tests.handlers:record_slowly", "event_types": ["order.*"]}],
            },
            # A source forwards or runs handlers, never both.
            "forwarded": {
                "kind": "generic",
                "id_header": "X-Id",
                "forward": {"url": "https://user:hunter2pass@billing.internal/in"},
            },
            "plain": {"kind": "generic", "id_header": "X-Id"},
        }
    }
    async with client_for(config, admin_tokens=[TOKEN]) as client:
        response = await client.get("/admin/sources", headers=AUTH)
    assert response.status_code == 200
    for secret in ("super-secret-hmac-key", "shared-query-token-value", "hunter2pass", TOKEN):
        assert secret not in response.text
    sources = {s["name"]: s for s in response.json()["sources"]}
    assert list(sources) == ["forwarded", "plain", "signed"]
    signed = sources["signed"]
    assert signed["kind"] == "generic"
    assert signed["mode"] == "sync"
    assert signed["max_attempts"] == 4
    assert signed["handlers"] == [
        {"target": "tests.handlers:record", "event_types": ["*"]},
        {"target": "tests.handlers:record_slowly", "event_types": ["order.*"]},
    ]
    assert signed["forward"] is None
    assert sources["forwarded"]["forward"] == {
        "url": "https://user:***@billing.internal/in",
        "timeout_seconds": 10.0,
    }
    assert signed["redelivery_days"] == 3.0
    assert sources["plain"]["forward"] is None
    assert sources["plain"]["mode"] == "async"


async def test_a_message_whose_handlers_batch_is_in_flight_shows_as_processing(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    # A batch of Python handlers leaves its rows as they were until it commits; its claims
    # (inbox_claims, the attempt each has begun) say they are in flight.
    running = await seed(db, "running")
    again = await seed(db, "again", status="retrying", attempts=1)
    await seed(db, "waiting")
    stale = await seed(db, "stale", attempts=2)  # its claim is of an attempt since finished
    claim = (
        "INSERT INTO inbox_claims (message_id, attempt, locked_until) "
        "VALUES ($1, $2, now() + interval '30 seconds')"
    )
    await db.execute(claim, running, 1)
    await db.execute(claim, again, 2)
    await db.execute(claim, stale, 2)

    async def listed(query: str) -> dict[str, str]:
        reply = await client.get(f"/admin/messages{query}", headers=AUTH)
        assert reply.status_code == 200, reply.text
        return {m["message_id"]: m["status"] for m in reply.json()["items"]}

    async with client_for(CONFIG, admin_tokens=[TOKEN]) as client:
        assert await listed("") == {
            "running": "processing",
            "again": "processing",
            "waiting": "pending",
            "stale": "pending",
        }
        assert await listed("?status=processing") == {
            "running": "processing",
            "again": "processing",
        }
        assert await listed("?status=pending") == {"waiting": "pending", "stale": "pending"}
        assert await listed("?status=retrying") == {}
        assert await listed("?status=retrying&status=processing") == {
            "running": "processing",
            "again": "processing",
        }
        detail = (await client.get(f"/admin/messages/{running}", headers=AUTH)).json()
        stats = (await client.get("/admin/stats", headers=AUTH)).json()
    # Its attempt in flight counts, as a leased message's does.
    assert (detail["status"], detail["attempt_count"]) == ("processing", 1)
    assert stats["by_status"]["processing"] == 2
    assert stats["by_status"]["pending"] == 2
    assert stats["by_status"]["retrying"] == 0
    # The rows themselves are unchanged.
    assert {r["status"] for r in await db.fetch("SELECT status FROM inbox_messages")} == {
        "pending",
        "retrying",
    }
