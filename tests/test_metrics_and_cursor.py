"""`/metrics` exposes the listed series; admin cursors round-trip and refuse forgeries."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import asyncpg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from service.api.admin.cursor import CursorError, Position, cursor_key, decode_cursor, encode_cursor
from service.core.metrics import Metrics
from tests.admin_seed import seed
from tests.conftest import AppFactory

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


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


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
    assert value("webhook_inbox_ingest_duration_seconds_count", source="hooks") == 3
    assert value("webhook_inbox_ingest_duration_seconds_count", source="") == 1
    assert value("webhook_inbox_messages", source="hooks", status="pending") == 2
    assert value("webhook_inbox_messages", source="removed", status="dead") == 1
    assert 590 < value("webhook_inbox_oldest_pending_age_seconds") < 700
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


def test_worker_hooks_record_attempts_and_durations() -> None:
    metrics = Metrics()
    metrics.attempt_finished("hooks", "retrying", 0.2)
    metrics.attempt_finished("hooks", "processed", 0.1)
    found = samples(metrics.render().decode())
    assert (
        found[("webhook_inbox_attempts_total", (("outcome", "retrying"), ("source", "hooks")))] == 1
    )
    assert found[("webhook_inbox_handler_duration_seconds_count", (("source", "hooks"),))] == 2


KEY = cursor_key(["token-a", "token-b"])
POSITION = Position(datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC), 42)


def test_cursor_round_trips_to_the_microsecond() -> None:
    cursor = encode_cursor(KEY, "scope", POSITION)
    assert decode_cursor(KEY, "scope", cursor) == POSITION
    assert "42" not in cursor  # opaque: base64, not the raw position


def test_cursor_key_depends_on_the_tokens_not_their_order() -> None:
    assert cursor_key(["token-b", "token-a"]) == KEY
    assert cursor_key(["token-a"]) != KEY


@pytest.mark.parametrize(
    "mutate",
    [
        lambda c: c[:-2] + ("AA" if not c.endswith("AA") else "BB"),
        lambda c: c.split(".")[0],
        lambda c: "",
        lambda c: "." + c,
        lambda c: c.replace(".", ".."),
        lambda c: "%%%." + c.split(".")[1],
    ],
)
def test_altered_cursors_are_refused(mutate: object) -> None:
    cursor = encode_cursor(KEY, "scope", POSITION)
    with pytest.raises(CursorError):
        decode_cursor(KEY, "scope", mutate(cursor))  # type: ignore[operator]


def test_cursor_is_bound_to_its_scope_and_key() -> None:
    cursor = encode_cursor(KEY, "scope", POSITION)
    with pytest.raises(CursorError):
        decode_cursor(KEY, "other-scope", cursor)
    with pytest.raises(CursorError):
        decode_cursor(cursor_key(["token-c"]), "scope", cursor)
    forged = encode_cursor(cursor_key(["guess"]), "scope", Position(POSITION.received_at, 1))
    with pytest.raises(CursorError):
        decode_cursor(KEY, "scope", forged)
