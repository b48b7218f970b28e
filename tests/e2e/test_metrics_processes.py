"""`serve --workers 2 --worker-processes 1`: whichever HTTP process answers `/metrics`, it counts
what both HTTP processes received and what the processing process did, and the per-source
gauges read from the database; the monitoring files' series are all there."""

from __future__ import annotations

import asyncio
from pathlib import Path

import asyncpg
import httpx
import pytest

from tests.integration.test_monitoring_files import series_used
from tests.processing_helpers import create_effects, wait_until
from tests.prometheus_text import samples
from tests.server import JSON_LOGS, ServerProcess, handler_source, serve_env
from tests.worker_process import wait_listening

pytestmark = pytest.mark.slow

TOML = handler_source("record", "ok") + handler_source("always_fail", "bad", max_attempts=1)


async def deliver(url: str, source: str, ids: list[str]) -> None:
    """A new connection per request, so both HTTP processes take some."""
    limits = httpx.Limits(max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=20) as client:

        async def send(message_id: str) -> None:
            reply = await client.post(
                f"/webhooks/{source}", content=b"{}", headers={"x-id": message_id}
            )
            assert reply.status_code == 200, reply.text

        await asyncio.gather(*(send(i) for i in ids))


def total(
    found: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
) -> float:
    wanted = set(labels.items())
    return sum(v for (n, ls), v in found.items() if n == name and wanted <= set(ls))


def delivery_pids(server: ServerProcess) -> set[int]:
    return {e["pid"] for e in server.log_events() if e.get("event") == "delivery"}


async def test_metrics_sum_two_http_processes_and_the_processing_one(
    database_url: str, db: asyncpg.Connection, tmp_path: Path
) -> None:
    await create_effects(db)
    env = serve_env(tmp_path, TOML, DATABASE_URL=database_url, **JSON_LOGS)
    args = ["serve", "--workers", "2", "--worker-processes", "1", "--port", "{port}"]
    # Three children import the service at once: at a load average of 10 the processing one
    # logged its first line 36 s after it started, and the HTTP ones had not answered at 60 s.
    with ServerProcess(env, tmp_path, args=args, startup_timeout=120) as server:
        await wait_listening(db, 1)
        # Rounds until both HTTP processes have taken deliveries (the kernel picks which
        # process accepts each connection, and a loaded machine can starve one for a while).
        sent = 0
        for _ in range(20):
            await deliver(server.url, "ok", [f"ok-{sent + i}" for i in range(30)])
            sent += 30
            if len(delivery_pids(server)) == 2:
                break
        await deliver(server.url, "bad", [f"bad-{i}" for i in range(3)])
        processed = "SELECT count(*) FROM inbox_messages WHERE status = 'processed'"
        await wait_until(db, processed, sent, 30)
        await wait_until(db, "SELECT count(*) FROM inbox_messages WHERE status = 'dead'", 3, 30)
        await asyncio.sleep(2.5)  # past the scrape cache of whichever process read it before
        scrapes = [
            httpx.get(f"{server.url}/metrics", headers={"connection": "close"}).text
            for _ in range(6)
        ]
    http_pids = delivery_pids(server)
    assert len(http_pids) == 2, http_pids  # both HTTP processes received deliveries
    for text in scrapes:  # whichever process answered
        found = samples(text)
        assert total(found, "webhook_inbox_deliveries_total", outcome="accepted") == sent + 3
        assert total(found, "webhook_inbox_ingest_duration_seconds_count") == sent + 3
        assert total(found, "webhook_inbox_attempts_total", outcome="processed") == sent
        assert total(found, "webhook_inbox_attempts_total", source="bad", outcome="dead") == 3
        assert total(found, "webhook_inbox_dead_letters", source="bad") == 3
        assert total(found, "webhook_inbox_dead_letters", source="ok") == 0
        assert total(found, "webhook_inbox_backlog_oldest_age_seconds", source="ok") == 0
        assert series_used() <= {name for name, _ in found}
