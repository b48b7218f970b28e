"""Issues acted on: acknowledged, resolved, ignored and reopened by an operator, and resolved
and retried as one, through `/admin/issues/{fingerprint}` and `webhook-inbox issues`, with a
real worker."""

from __future__ import annotations

import asyncpg
import pytest

from tests import handlers
from tests.admin_seed import AUTH, TOKEN
from tests.cli_runner import cli
from tests.conftest import AppFactory
from tests.processing_helpers import source, wait_until

DEAD = "SELECT count(*) FROM inbox_messages WHERE status = 'dead'"
PROCESSED = "SELECT count(*) FROM inbox_messages WHERE status = 'processed'"
INSERT = (
    "INSERT INTO inbox_messages (source, message_id, event_type, body) VALUES ($1, $2, $3, '{}')"
)
UNKNOWN = "0123456789abcdef"


def switched() -> dict[str, object]:
    """A source whose `charge.*` events fail with RuntimeError while `sync_fail` is set, and
    `refund.*` always with KeyError; one attempt each, so a failure is dead at once."""
    return source(
        handler=[
            {"target": "tests.handlers:sync_switch", "event_types": ["charge.*"]},
            {"target": "tests.handlers:fail_on_missing_field", "event_types": ["refund.*"]},
        ],
        max_attempts=1,
    )


async def insert(db: asyncpg.Connection, event_type: str, *ids: str) -> None:
    await db.executemany(INSERT, [("hooks", i, event_type) for i in ids])


async def fingerprints(db: asyncpg.Connection) -> dict[str, str]:
    rows = await db.fetch("SELECT error_type, fingerprint FROM inbox_issues")
    return {r["error_type"]: r["fingerprint"] for r in rows}


async def test_retry_replays_only_the_issues_dead_messages_and_a_new_failure_reopens_it(
    worker_for: AppFactory, db: asyncpg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(handlers.state, "sync_fail", True)
    async with worker_for({"sources": {"hooks": switched()}}, admin_tokens=TOKEN) as client:
        await insert(db, "charge.succeeded", "c1", "c2", "c3")
        await insert(db, "refund.created", "r1", "r2")
        await wait_until(db, DEAD, 5)
        charge = (await fingerprints(db))["RuntimeError"]
        path = f"/admin/issues/{charge}"

        counted = await client.post(f"{path}/retry", json={"dry_run": True}, headers=AUTH)
        assert counted.status_code == 200, counted.text
        assert counted.json() == {"matched": 3, "retried": 0}
        assert await db.fetchval(DEAD) == 5
        assert await db.fetchval("SELECT count(DISTINCT status) FROM inbox_issues") == 1

        monkeypatch.setitem(handlers.state, "sync_fail", False)  # the cause is fixed
        retried = await client.post(f"{path}/retry", json={"operator": "ana"}, headers=AUTH)
        assert retried.json() == {"matched": 3, "retried": 3}
        await wait_until(db, PROCESSED, 3)
        shown = (await client.get(path, headers=AUTH)).json()
        assert (shown["status"], shown["acknowledged_by"], shown["dead"]) == ("resolved", "ana", 0)
        assert [m["message_id"] for m in shown["messages"]] == ["c3", "c2", "c1"]
        assert {m["status"] for m in shown["messages"]} == {"processed"}
        # The other issue's messages are still dead, and it is still open.
        dead = await db.fetch("SELECT message_id FROM inbox_messages WHERE status = 'dead'")
        assert sorted(r["message_id"] for r in dead) == ["r1", "r2"]
        listed = (await client.get("/admin/issues", headers=AUTH)).json()["items"]
        assert {(i["error_type"], i["status"]) for i in listed} == {
            ("RuntimeError", "resolved"),
            ("KeyError", "open"),
        }

        monkeypatch.setitem(handlers.state, "sync_fail", True)  # the cause comes back
        await insert(db, "charge.succeeded", "c4")
        await wait_until(db, DEAD, 3)
        again = (await client.get(path, headers=AUTH)).json()
    assert (again["status"], again["dead"]) == ("open", 1)
    assert again["reopened_at"] is not None
    assert again["messages"][0]["message_id"] == "c4"


async def test_an_operator_acknowledges_ignores_reopens_and_resolves_an_issue(
    worker_for: AppFactory, db: asyncpg.Connection
) -> None:
    async with worker_for({"sources": {"hooks": switched()}}, admin_tokens=TOKEN) as client:
        await insert(db, "refund.created", "r1")
        await wait_until(db, DEAD, 1)
        path = f"/admin/issues/{(await fingerprints(db))['KeyError']}"
        steps = []
        for action, body in (
            ("acknowledge", {"operator": "ana", "note": "INC-4211"}),
            ("ignore", {"operator": "bo"}),
            ("reopen", {"operator": "bo", "note": "not expected after all"}),
            ("resolve", {"operator": "ana"}),
        ):
            answer = await client.post(f"{path}/{action}", json=body, headers=AUTH)
            assert answer.status_code == 200, answer.text
            issue = answer.json()
            steps.append((issue["status"], issue["acknowledged_by"], issue["note"]))
        unknown = await client.post(
            f"/admin/issues/{UNKNOWN}/resolve", json={"operator": "ana"}, headers=AUTH
        )
        unknown_retry = await client.post(
            f"/admin/issues/{UNKNOWN}/retry", json={"dry_run": True}, headers=AUTH
        )
        unknown_show = await client.get(f"/admin/issues/{UNKNOWN}", headers=AUTH)
        no_operator = await client.post(f"{path}/acknowledge", json={}, headers=AUTH)
    assert steps == [
        ("acknowledged", "ana", "INC-4211"),
        ("ignored", "bo", "INC-4211"),
        ("open", "bo", "not expected after all"),
        ("resolved", "ana", "not expected after all"),
    ]
    for refused in (unknown, unknown_retry, unknown_show):
        assert refused.status_code == 404
        assert refused.json()["detail"] == f"no issue with fingerprint {UNKNOWN}"
    assert no_operator.status_code == 422


async def test_the_issues_command_lists_shows_decides_and_retries(
    worker_for: AppFactory,
    db: asyncpg.Connection,
    database_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(handlers.state, "sync_fail", True)
    async with worker_for({"sources": {"hooks": switched()}}):
        await insert(db, "charge.succeeded", "c1", "c2")
        await insert(db, "refund.created", "r1")
        await wait_until(db, DEAD, 3)
        found = await fingerprints(db)
        charge, refund = found["RuntimeError"], found["KeyError"]

        listed = await cli(monkeypatch, database_url, "issues", "list", "--json")
        assert listed.status == 0, listed.err
        assert {i["fingerprint"]: i["dead"] for i in listed.json()["items"]} == {
            charge: 2,
            refund: 1,
        }
        table = await cli(monkeypatch, database_url, "issues", "list", "--status", "open")
        assert table.out.splitlines()[0].split()[:3] == ["FINGERPRINT", "SOURCE", "STATUS"]
        assert "RuntimeError in tests.handlers:sync_switch" in table.out
        shown = await cli(monkeypatch, database_url, "issues", "show", charge)
        assert "sync handler failure" in shown.out
        assert "c2" in shown.out

        acked = await cli(
            monkeypatch, database_url, "issues", "acknowledge", refund, "--note", "on it",
            "--operator", "ana", "--json",
        )  # fmt: skip
        assert (acked.json()["status"], acked.json()["note"]) == ("acknowledged", "on it")
        no_note = await cli(monkeypatch, database_url, "issues", "acknowledge", refund)
        assert no_note.status == 2
        unknown = await cli(monkeypatch, database_url, "issues", "resolve", UNKNOWN)
        assert unknown.status == 1
        assert unknown.err.strip().endswith(f"no issue with fingerprint {UNKNOWN}")
        bad = await cli(monkeypatch, database_url, "issues", "show", "nope")
        assert bad.status == 2

        counted = await cli(monkeypatch, database_url, "issues", "retry", charge, "--dry-run")
        assert counted.out.startswith("2 dead messages of issue ")
        monkeypatch.setitem(handlers.state, "sync_fail", False)
        retried = await cli(monkeypatch, database_url, "issues", "retry", charge, "--json")
        assert retried.json() == {"matched": 2, "retried": 2}
        await wait_until(db, PROCESSED, 2)
        ignored = await cli(monkeypatch, database_url, "issues", "ignore", refund, "--json")
        assert ignored.json()["status"] == "ignored"
    statuses = dict(await db.fetch("SELECT fingerprint, status FROM inbox_issues"))
    assert statuses == {charge: "resolved", refund: "ignored"}
