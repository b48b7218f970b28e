"""`/metrics` on a real database: the listed series, counted per app."""

from __future__ import annotations

from datetime import timedelta

import asyncpg

from tests.admin_seed import seed
from tests.conftest import AppFactory
from tests.prometheus_text import samples

# A handler (no worker runs here) keeps accepted messages pending, as the backlog gauges expect.
CONFIG = {
    "sources": {
        "hooks": {
            "kind": "generic",
            "id_header": "X-Message-Id",
            "handlers": ["tests.handlers:record"],
        }
    }
}


async def test_metrics_expose_deliveries_latency_statuses_and_backlog(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    await seed(db, "old-pending", status="pending", age=timedelta(minutes=10))
    await seed(db, "gone", source="removed", status="dead")
    json_headers = {"content-type": "application/json"}
    async with client_for(CONFIG) as client:
        await client.post(
            "/webhooks/hooks", content=b"{}", headers={**json_headers, "X-Message-Id": "a"}
        )
        await client.post(
            "/webhooks/hooks", content=b"{}", headers={**json_headers, "X-Message-Id": "a"}
        )
        await client.post("/webhooks/hooks", content=b"{}", headers=json_headers)  # no id: 400
        await client.post("/webhooks/nowhere", content=b"{}", headers=json_headers)
        response = await client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    found = samples(response.text)

    def value(name: str, **labels: str) -> float:
        return found[(name, tuple(sorted(labels.items())))]

    deliveries = "webhook_inbox_deliveries_total"
    assert value(deliveries, source="hooks", outcome="accepted", reason="") == 1
    assert value(deliveries, source="hooks", outcome="duplicate", reason="") == 1
    assert value(deliveries, source="hooks", outcome="rejected", reason="bad_request") == 1
    assert value(deliveries, source="", outcome="rejected", reason="unknown_source") == 1
    # The redelivery's plain INSERT met the stored key; its batch was written again, counting.
    assert value("webhook_inbox_ingest_batches_rewritten_total") == 1
    assert value("webhook_inbox_ingest_duration_seconds_count", source="hooks") == 3
    assert value("webhook_inbox_ingest_duration_seconds_count", source="") == 1
    assert value("webhook_inbox_messages", source="hooks", status="pending") == 2
    assert value("webhook_inbox_messages", source="removed", status="dead") == 1
    assert 590 < value("webhook_inbox_oldest_pending_age_seconds") < 700
    # Per source: the backlog's oldest age and the dead letters (zero for a configured source).
    assert 590 < value("webhook_inbox_backlog_oldest_age_seconds", source="hooks") < 700
    assert value("webhook_inbox_dead_letters", source="hooks") == 0
    assert value("webhook_inbox_dead_letters", source="removed") == 1
    # The catch-up: two messages left; two received in the last 10 s (the dead one too), none
    # drained.
    assert value("webhook_inbox_backlog_messages") == 2
    assert value("webhook_inbox_arrival_rate_per_second") == 0.2
    assert value("webhook_inbox_drain_rate_per_second") == 0
    assert value("webhook_inbox_catch_up_seconds") == float("inf")
    # Present at zero before anything happened; the worker and retention count them.
    assert value("webhook_inbox_handler_duration_seconds_count", source="hooks") == 0
    assert value("webhook_inbox_pruned_rows_total", status="dead") == 0
    assert value("webhook_inbox_admin_actions_total", action="admin_retry") == 0


async def test_each_app_counts_on_its_own(client_for: AppFactory) -> None:
    async with client_for(CONFIG) as client:
        await client.post("/webhooks/nowhere", content=b"{}")
    async with client_for(CONFIG) as client:
        text = (await client.get("/metrics")).text
    assert 'reason="unknown_source"' not in text


async def test_scrapes_close_together_share_one_database_read(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    async with client_for(CONFIG) as client:
        await client.get("/metrics")
        await seed(db, "late", source="hooks", status="dead")
        cached = samples((await client.get("/metrics")).text)
        assert cached[("webhook_inbox_dead_letters", (("source", "hooks"),))] == 0


ISSUE = """
    INSERT INTO inbox_issues (fingerprint, source, error_type, status, first_seen, last_seen,
                              failed_attempts)
    VALUES ($1, $2, 'KeyError', $3, now(), now() - $4 * interval '1 second', $5)
"""


async def test_issues_by_status_and_the_newest_active_issues_failed_attempts(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    # 105 open issues, the first failing most recently; one of each other status.
    await db.executemany(ISSUE, [(f"open{n:03}", "hooks", "open", n, 1000 + n) for n in range(105)])
    await db.executemany(
        ISSUE,
        [
            ("ack", "other", "acknowledged", 0, 7),
            ("resolved", "hooks", "resolved", 0, 8),
            ("ignored", "hooks", "ignored", 0, 9),
        ],
    )
    async with client_for(CONFIG) as client:
        found = samples((await client.get("/metrics")).text)

    def value(name: str, **labels: str) -> float:
        return found[(name, tuple(sorted(labels.items())))]

    assert value("webhook_inbox_issues", source="hooks", status="open") == 105
    assert value("webhook_inbox_issues", source="hooks", status="resolved") == 1
    assert value("webhook_inbox_issues", source="hooks", status="ignored") == 1
    assert value("webhook_inbox_issues", source="other", status="acknowledged") == 1
    failed = {
        dict(labels)["fingerprint"]: v
        for (name, labels), v in found.items()
        if name == "webhook_inbox_issue_failed_attempts"
    }
    assert len(failed) == 100  # the bound: the most recently failing open or acknowledged
    assert failed["open000"] == 1000
    assert failed["ack"] == 7
    assert "open099" not in failed  # the oldest go first
    assert "resolved" not in failed
    assert "ignored" not in failed
