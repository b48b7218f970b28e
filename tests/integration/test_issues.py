"""Issues: failed attempts of a real worker grouped by cause, counted in the transaction that
records them, and listed by `GET /admin/issues`."""

from __future__ import annotations

import asyncpg

from tests.admin_seed import AUTH, TOKEN
from tests.conftest import AppFactory
from tests.http_server import scripted_server
from tests.processing_helpers import source, wait_until

FAILED = "SELECT count(*) FROM inbox_messages WHERE status IN ('retrying', 'dead')"
INSERT = (
    "INSERT INTO inbox_messages (source, message_id, event_type, body) VALUES ($1, $2, $3, '{}')"
)


def by_event_type(**extra: object) -> dict[str, object]:
    """A source whose `charge.*` events fail with ValueError in one handler and `refund.*`
    with KeyError in another."""
    return source(
        handler=[
            {"target": "tests.handlers:always_fail", "event_types": ["charge.*"]},
            {"target": "tests.handlers:fail_on_missing_field", "event_types": ["refund.*"]},
        ],
        **extra,
    )


async def insert(db: asyncpg.Connection, source_name: str, event_type: str, *ids: str) -> None:
    await db.executemany(INSERT, [(source_name, i, event_type) for i in ids])


async def test_failures_of_three_causes_across_hundreds_of_messages_are_three_issues(
    worker_for: AppFactory, db: asyncpg.Connection
) -> None:
    # The handlers' messages wait (retrying) for a retry far off; the forward's are dead at once.
    far_off = {"backoff_base_seconds": 600, "backoff_max_seconds": 600}
    config = {
        "sources": {
            "hooks": by_event_type(max_attempts=5, **far_off),
            "relay": source(max_attempts=1),
        }
    }
    async with scripted_server(*[(503, {})] * 60) as server:
        # A breaker that does not open: every message is called.
        forward = {"url": server.url, "timeout_seconds": 5, "breaker_failures": 1000}
        config["sources"]["relay"]["forward"] = forward
        async with worker_for(config, admin_tokens=TOKEN) as client:
            await insert(db, "hooks", "charge.succeeded", *(f"c{i}" for i in range(120)))
            await insert(db, "hooks", "refund.created", *(f"r{i}" for i in range(120)))
            await insert(db, "relay", "order.created", *(f"f{i}" for i in range(60)))
            await wait_until(db, FAILED, 300, 60)
            listed = await client.get("/admin/issues", headers=AUTH)
            only_relay = await client.get("/admin/issues", params={"source": "relay"}, headers=AUTH)
            none_resolved = await client.get(
                "/admin/issues", params={"status": "resolved"}, headers=AUTH
            )
    assert listed.status_code == 200, listed.text
    issues = {(i["error_type"], i["handler"]): i for i in listed.json()["items"]}
    assert len(issues) == 3
    charge = issues["ValueError", "tests.handlers:always_fail"]
    refund = issues["KeyError", "tests.handlers:fail_on_missing_field"]
    forward = issues["ForwardFailed", None]
    counts = {key: (i["retrying"], i["dead"], i["status"]) for key, i in issues.items()}
    assert counts == {
        ("ValueError", "tests.handlers:always_fail"): (120, 0, "open"),
        ("KeyError", "tests.handlers:fail_on_missing_field"): (120, 0, "open"),
        ("ForwardFailed", None): (0, 60, "open"),
    }
    # Each failed attempt names its issue, and each issue counts its failed attempts: one per
    # message, and a second for the few whose jittered backoff (0 to 600 s) came due already.
    by_fingerprint = dict(
        await db.fetch("SELECT fingerprint, count(*) FROM inbox_attempts GROUP BY fingerprint")
    )
    # (Read here, once the worker has stopped: the listing was read while it ran.)
    counted = dict(await db.fetch("SELECT fingerprint, failed_attempts FROM inbox_issues"))
    assert by_fingerprint == counted
    assert set(counted) == {i["fingerprint"] for i in issues.values()}
    assert 120 <= charge["failed_attempts"] < 130
    assert 120 <= refund["failed_attempts"] < 130
    assert forward["failed_attempts"] == 60
    assert (charge["source"], charge["destination"]) == ("hooks", None)
    assert charge["frame"] == "tests.handlers:always_fail"
    assert charge["sample_error"] == "downstream says no"
    assert "raise ValueError" in charge["sample_traceback"]
    assert refund["frame"] == "tests.handlers:fail_on_missing_field"
    assert (forward["source"], forward["frame"]) == ("relay", None)
    assert forward["detail"] == f"5xx 127.0.0.1:{server.port}/events"
    assert forward["sample_error"] == "HTTP 503: scripted failure"
    assert [i["fingerprint"] for i in only_relay.json()["items"]] == [forward["fingerprint"]]
    assert none_resolved.json() == {"items": []}
    seen = [i["last_seen"] for i in listed.json()["items"]]
    assert seen == sorted(seen, reverse=True)


async def test_a_resolved_issue_opens_again_on_a_new_failure_and_an_ignored_one_stays_ignored(
    worker_for: AppFactory, db: asyncpg.Connection
) -> None:
    config = {"sources": {"hooks": by_event_type(max_attempts=1)}}
    async with worker_for(config) as client:
        assert client is not None
        await insert(db, "hooks", "charge.succeeded", "c1")
        await insert(db, "hooks", "refund.created", "r1")
        await wait_until(db, FAILED, 2)
        await db.execute(
            "UPDATE inbox_issues SET status = CASE error_type WHEN 'ValueError' THEN 'resolved' "
            "ELSE 'ignored' END"
        )
        await insert(db, "hooks", "charge.succeeded", "c2")
        await insert(db, "hooks", "refund.created", "r2")
        await wait_until(db, FAILED, 4)
    rows = {
        r["error_type"]: (r["status"], r["failed_attempts"], r["reopened_at"] is not None)
        for r in await db.fetch("SELECT * FROM inbox_issues")
    }
    assert rows == {"ValueError": ("open", 2, True), "KeyError": ("ignored", 2, False)}


async def test_an_acknowledged_issue_stays_acknowledged_and_a_destination_is_part_of_it(
    worker_for: AppFactory, db: asyncpg.Connection
) -> None:
    routed = source(
        max_attempts=1,
        handlers=[],
        destinations={
            "billing": {"handlers": ["tests.handlers:always_fail"]},
            "warehouse": {"handlers": ["tests.handlers:record_warehouse"]},
        },
    )
    async with worker_for({"sources": {"hooks": routed}}):
        await insert(db, "hooks", "order.created", "d1")
        await wait_until(db, FAILED, 1)
        await db.execute("UPDATE inbox_issues SET status = 'acknowledged'")
        await insert(db, "hooks", "order.created", "d2")
        await wait_until(db, FAILED, 2)
    rows = await db.fetch("SELECT * FROM inbox_issues")
    assert [(r["destination"], r["handler"], r["status"], r["failed_attempts"]) for r in rows] == [
        ("billing", "tests.handlers:always_fail", "acknowledged", 2)
    ]
    attempts = await db.fetch(
        "SELECT destination, fingerprint FROM inbox_attempts ORDER BY destination, id"
    )
    assert [(a["destination"], a["fingerprint"]) for a in attempts] == [
        ("billing", rows[0]["fingerprint"]),
        ("billing", rows[0]["fingerprint"]),
        ("warehouse", None),
        ("warehouse", None),
    ]
