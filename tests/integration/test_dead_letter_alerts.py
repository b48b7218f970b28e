"""Dead-letter alerts against a real local HTTP server: batched per source and interval,
retried with backoff, durable across a pass that never delivered, sent by the worker."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from service.core.db import create_engine
from service.core.metrics import Metrics
from service.core.settings import Settings
from service.processing.pipeline import resolve_pipelines
from service.sources.config import AlertsConfig
from service.sources.config_file import parse_inbox_config
from service.store.dead_letter_alerts import claim_notices, last_attempt_id
from service.worker.dead_letter_alerts import alert_pass, target_key
from service.worker.runtime import run_worker
from tests.conftest import AppFactory
from tests.http_server import HANG, ScriptedServer, scripted_server
from tests.processing_helpers import (
    WORKER_SETTINGS,
    create_effects,
    delivery,
    source,
    wait_until,
)
from tests.prometheus_text import samples

DEAD = "SELECT count(*) FROM inbox_messages WHERE status = 'dead'"


def dying(**extra: Any) -> dict[str, Any]:
    """Two sources whose handler always fails on its only attempt: each message goes dead."""
    failing = source("tests.handlers:always_fail", max_attempts=1)
    return {"sources": {"hooks": failing, "other": failing}, **extra}


def dead_letter_notices(server: ScriptedServer) -> list[str]:
    """The texts of the dead-letter notices the server received (the worker announces the
    issue the dying handler opens too: tests/integration/test_issue_alerts.py)."""
    texts = [json.loads(r.body)["text"] for r in server.requests]
    return [t for t in texts if "went dead" in t]


def alerts(*urls: str, **extra: Any) -> AlertsConfig:
    return AlertsConfig.model_validate({"webhooks": list(urls), "interval_seconds": 1, **extra})


@pytest.fixture
async def engine(database_url: str) -> AsyncIterator[AsyncEngine]:
    engine = create_engine(database_url, Settings(database_url=database_url))
    try:
        yield engine
    finally:
        await engine.dispose()


async def kill(
    client: httpx.AsyncClient, db: asyncpg.Connection, *ids: str, to: str = "hooks"
) -> None:
    before = await db.fetchval(DEAD)
    for message_id in ids:
        await client.post(f"/webhooks/{to}", content=b"{}", headers=delivery(message_id))
    await wait_until(db, DEAD, before + len(ids), 10)


@pytest.fixture
async def inbox(client_for: AppFactory, db: asyncpg.Connection) -> AsyncIterator[httpx.AsyncClient]:
    """An inbox whose two sources' messages all go dead, with a worker beside it."""
    await create_effects(db)
    async with client_for(dying(), run_worker=True, **WORKER_SETTINGS) as client:
        yield client


async def one_pass(engine: AsyncEngine, config: AlertsConfig, sources: list[str]) -> int:
    async with httpx.AsyncClient() as http:
        return await alert_pass(engine, http, config, sources, settle_seconds=0)


async def test_one_notice_per_source_with_the_count_and_first_errors(
    inbox: httpx.AsyncClient, db: asyncpg.Connection, engine: AsyncEngine
) -> None:
    client = inbox
    async with scripted_server() as slack:
        # A long interval while a new dead letter must wait (however slow the machine is),
        # then a short one, to see the next notice without waiting long.
        hourly = alerts(slack.url, max_errors=2, interval_seconds=3600)
        config = alerts(slack.url, max_errors=2)
        assert await one_pass(engine, hourly, ["hooks", "other"]) == 0  # watermarks start now
        await kill(client, db, "d1", "d2", "d3")
        await kill(client, db, "o1", to="other")
        assert await one_pass(engine, hourly, ["hooks", "other"]) == 2
        # Within the interval, a new dead letter waits for the next notice.
        await kill(client, db, "d4")
        assert await one_pass(engine, hourly, ["hooks", "other"]) == 0
        await asyncio.sleep(1.1)
        assert await one_pass(engine, config, ["hooks", "other"]) == 1

    bodies = [json.loads(r.body) for r in slack.requests]
    assert all(set(body) == {"text"} for body in bodies)  # Slack's incoming-webhook shape
    hooks, other, later = sorted(bodies[:2], key=lambda b: "`other`" in b["text"]) + bodies[2:]
    assert "3 messages of source `hooks` went dead" in hooks["text"]
    # The first two to go dead (the worker's claim loops may finish them in any order).
    quoted = [i for i in ("d1", "d2", "d3") if f"message `{i}`" in hooks["text"]]
    assert len(quoted) == 2  # max_errors = 2
    assert "downstream says no" in hooks["text"]  # the handler's error
    assert "1 more" in hooks["text"]
    assert "1 message of source `other` went dead" in other["text"]
    assert "1 message of source `hooks` went dead" in later["text"]
    assert "message `d4`" in later["text"]


async def test_a_failing_endpoint_is_retried_with_backoff(
    inbox: httpx.AsyncClient, db: asyncpg.Connection, engine: AsyncEngine
) -> None:
    client = inbox
    async with scripted_server((500, {}), (503, {})) as endpoint:
        config = alerts(endpoint.url, format="json")
        await one_pass(engine, config, ["hooks"])
        await kill(client, db, "r1")
        assert await one_pass(engine, config, ["hooks"]) == 1
    first, second, third = endpoint.requests
    assert second.at - first.at >= 1.0
    assert third.at - second.at >= 2.0
    body = json.loads(third.body)
    assert body["source"] == "hooks"
    assert body["count"] == 1
    assert [m["message_id"] for m in body["messages"]] == ["r1"]


async def test_an_undelivered_notice_is_sent_again_after_the_interval(
    inbox: httpx.AsyncClient, db: asyncpg.Connection, engine: AsyncEngine
) -> None:
    client = inbox
    async with scripted_server((500, {}), (500, {})) as endpoint:
        config = alerts(endpoint.url, send_attempts=2)
        await one_pass(engine, config, ["hooks"])
        await kill(client, db, "u1")
        assert await one_pass(engine, config, ["hooks"]) == 0  # two tries, both failed
        await kill(client, db, "u2")
        # A pass that claimed its notices and then died (no watermark moved) loses nothing.
        settled = await last_attempt_id(engine)
        claimed = await claim_notices(
            engine,
            target_key(endpoint.url),
            ["hooks"],
            interval_seconds=0,
            max_errors=3,
            settled=settled,
        )
        assert [n.count for n in claimed] == [2]
        await asyncio.sleep(1.1)
        assert await one_pass(engine, config, ["hooks"]) == 1
    assert len(endpoint.requests) == 3
    text = json.loads(endpoint.requests[-1].body)["text"]
    assert "2 messages of source `hooks` went dead" in text


async def test_the_worker_sends_alerts_and_one_failing_webhook_spares_the_other(
    database_url: str, client_for: AppFactory, db: asyncpg.Connection
) -> None:
    await create_effects(db)
    async with (
        scripted_server(*[(500, {})] * 20) as broken,
        scripted_server() as slack,
        client_for(dying()) as client,
    ):
        raw = dying(alerts={"webhooks": [broken.url, slack.url], "interval_seconds": 1})
        inbox = parse_inbox_config(raw)
        settings = Settings(database_url=database_url, **WORKER_SETTINGS)
        metrics = Metrics(sources=inbox.sources)
        stop = asyncio.Event()
        pipelines = resolve_pipelines(inbox)
        worker = asyncio.create_task(
            run_worker(settings, database_url, pipelines, stop, retention=inbox, metrics=metrics)
        )
        try:
            await wait_until(db, "SELECT count(*) FROM inbox_alert_watermarks", 4, 30)
            await kill(client, db, "w1")
            async with asyncio.timeout(30):  # a pass each second; generous for a loaded machine
                while not (dead_letter_notices(slack) and broken.requests):
                    await asyncio.sleep(0.1)
        finally:
            stop.set()
            await worker
    (notice,) = dead_letter_notices(slack)
    assert "message `w1`" in notice
    counted = samples(metrics.render().decode())
    assert counted[("webhook_inbox_alert_notices_total", (("outcome", "sent"),))] == 1

    assert broken.requests  # tried, failing, and the other webhook got its notice all the same


async def test_messages_that_die_as_the_worker_starts_are_announced(
    database_url: str, client_for: AppFactory, db: asyncpg.Connection
) -> None:
    # The trial of issue 50: deliveries waiting when the worker starts go dead in its first
    # milliseconds. Watermarks written by the first pass (after its settle second) started past
    # them, and no notice was ever sent; the worker now writes them before its claim loops.
    await create_effects(db)
    async with scripted_server() as slack, client_for(dying()) as client:
        for n in range(5):
            await client.post("/webhooks/hooks", content=b"{}", headers=delivery(f"s{n}"))
        inbox = parse_inbox_config(dying(alerts={"webhooks": [slack.url], "interval_seconds": 2}))
        settings = Settings(database_url=database_url, **WORKER_SETTINGS)
        stop = asyncio.Event()
        worker = asyncio.create_task(
            run_worker(settings, database_url, resolve_pipelines(inbox), stop, retention=inbox)
        )
        try:
            await wait_until(db, DEAD, 5, 30)
            async with asyncio.timeout(30):
                while not dead_letter_notices(slack):
                    await asyncio.sleep(0.1)
        finally:
            stop.set()
            await worker
    (notice,) = dead_letter_notices(slack)
    assert "5 messages of source `hooks` went dead" in notice


async def test_two_processes_passing_at_once_send_one_notice(
    inbox: httpx.AsyncClient, db: asyncpg.Connection, engine: AsyncEngine
) -> None:
    client = inbox
    async with scripted_server() as endpoint:
        config = alerts(endpoint.url, interval_seconds=60)
        await one_pass(engine, config, ["hooks"])
        await kill(client, db, "c1", "c2")
        counts = await asyncio.gather(*(one_pass(engine, config, ["hooks"]) for _ in range(4)))
    assert sorted(counts) == [0, 0, 0, 1]
    (notice,) = endpoint.requests
    assert "2 messages of source `hooks` went dead" in json.loads(notice.body)["text"]


async def test_a_webhook_that_never_answers_holds_up_no_processing_and_is_logged(
    database_url: str,
    client_for: AppFactory,
    db: asyncpg.Connection,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="service.alerts")
    await create_effects(db)
    raw: dict[str, Any] = {
        "sources": {
            "hooks": source("tests.handlers:always_fail", max_attempts=1),
            "fine": source("tests.handlers:record"),
        }
    }
    async with scripted_server((HANG, {}), (HANG, {})) as hanging, client_for(raw) as client:
        raw["alerts"] = {
            "webhooks": [hanging.url],
            "interval_seconds": 1,
            "timeout_seconds": 8,
            "send_attempts": 1,
        }
        inbox = parse_inbox_config(raw)
        settings = Settings(database_url=database_url, **WORKER_SETTINGS)
        stop = asyncio.Event()
        worker = asyncio.create_task(
            run_worker(settings, database_url, resolve_pipelines(inbox), stop, retention=inbox)
        )
        try:
            await wait_until(db, "SELECT count(*) FROM inbox_alert_watermarks", 2, 30)
            await kill(client, db, "h1")
            async with asyncio.timeout(30):
                await hanging.arrived.wait()  # the notice's POST is held open from here on
            for n in range(5):
                await client.post("/webhooks/fine", content=b"{}", headers=delivery(f"f{n}"))
            # All five are processed while the webhook still holds the notice (8 s timeout).
            await wait_until(
                db, "SELECT count(*) FROM inbox_messages WHERE status = 'processed'", 5, 6
            )
            assert len(hanging.requests) == 1
            assert "dead-letter alert failed" not in caplog.text  # the POST is still open
            async with asyncio.timeout(30):
                while not any(r.getMessage() == "dead-letter alert failed" for r in caplog.records):
                    await asyncio.sleep(0.1)
        finally:
            stop.set()
            await worker
    failed = [r for r in caplog.records if r.getMessage() == "dead-letter alert failed"]
    assert failed[0].source == "hooks"  # type: ignore[attr-defined]
    assert failed[0].count == 1  # type: ignore[attr-defined]
    assert "Timeout" in failed[0].error  # type: ignore[attr-defined]
    assert failed[0].target == target_key(hanging.url)  # type: ignore[attr-defined]
    assert hanging.url not in caplog.text  # the URL is a secret: the logs name its hash
