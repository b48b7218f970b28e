"""`serve --workers 2 --worker-processes 2`: two HTTP and two processing processes, one database.

Guards cross-process safety (issue 6 item 7): the dedup key is a unique constraint in
PostgreSQL, not per-process memory, so one id delivered to both processes at once is recorded
once; claims are `FOR UPDATE SKIP LOCKED`, so both workers never run one message. Were dedup or
claiming done in process memory, an id would get two `accepted` answers or two effects here.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import asyncpg
import httpx
import psutil
import pytest

from service.core.db import asyncpg_dsn
from tests.processing_helpers import create_effects, wait_until
from tests.server import JSON_LOGS, ServerProcess, handler_source, serve_env
from tests.worker_process import wait_listening

pytestmark = pytest.mark.slow

TOML = handler_source("record")

UNPROCESSED = "SELECT count(*) FROM inbox_messages WHERE status <> 'processed'"


def two_processes(tmp_path: Path, **env: str) -> ServerProcess:
    environment = serve_env(tmp_path, TOML, **JSON_LOGS, **env)
    args = ["serve", "--workers", "2", "--worker-processes", "2", "--port", "{port}"]
    return ServerProcess(environment, tmp_path, args=args, startup_timeout=60)


async def deliver_each_twice(url: str, ids: list[str]) -> dict[str, list[str]]:
    """Both deliveries of an id at once; a new connection per request, so both processes serve."""
    limits = httpx.Limits(max_connections=16, max_keepalive_connections=0)
    answers: dict[str, list[str]] = {i: [] for i in ids}
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=20) as client:

        async def send(message_id: str) -> None:
            reply = await client.post(
                "/webhooks/s", content=b'{"n": 1}', headers={"x-id": message_id}
            )
            assert reply.status_code == 200, reply.text
            answers[message_id].append(reply.json()["status"])

        await asyncio.gather(*(send(i) for i in ids for _ in range(2)))
    return answers


def assert_recorded_once(answers: dict[str, list[str]]) -> None:
    pairs = Counter(tuple(sorted(statuses)) for statuses in answers.values())
    assert pairs == {("accepted", "duplicate"): len(answers)}, pairs


async def assert_effects_once(db: asyncpg.Connection, ids: list[str]) -> None:
    await wait_until(db, UNPROCESSED, 0, 30)
    rows = await db.fetch("SELECT message_id, count(*) AS n FROM effects GROUP BY message_id")
    assert {r["message_id"]: r["n"] for r in rows} == dict.fromkeys(ids, 1)
    # A redelivery that met its message in a running batch is added to the row at the
    # worker's next poll (inbox_receipts).
    await wait_until(db, "SELECT sum(receive_count) FROM inbox_messages", 2 * len(ids), 10)


def serving_pids(server: ServerProcess) -> set[int]:
    return {e["pid"] for e in server.log_events() if e.get("event") == "delivery"}


def child_pids(server: ServerProcess) -> set[int]:
    assert server.process is not None
    return {p.pid for p in psutil.Process(server.process.pid).children(recursive=True)}


async def test_two_server_processes_share_one_database_exactly_once(
    database_url: str, db: asyncpg.Connection, tmp_path: Path
) -> None:
    await create_effects(db)
    ids = [f"multi-{i}" for i in range(200)]  # 400 deliveries
    with two_processes(tmp_path, DATABASE_URL=database_url) as server:
        await wait_listening(db, 2)  # both processing processes
        answers = await deliver_each_twice(server.url, ids)
        await assert_effects_once(db, ids)
        children = child_pids(server)
        scraped = httpx.get(f"{server.url}/metrics").text
        ready = httpx.get(f"{server.url}/readyz").json()
    assert_recorded_once(answers)
    # Source `s` checks nothing (no [hmac], basic_auth or token): it starts, and says so once.
    unsigned = "accepts unsigned deliveries: it has no [hmac], basic_auth or token"
    assert ready["warnings"] == [f"source s {unsigned}"]
    warned = [e for e in server.log_events() if e.get("event") == unsigned]
    assert [(e["level"], e["role"], e["source"]) for e in warned] == [
        ("warning", "supervisor", "s")
    ]
    # Both processes answered deliveries (their pids are children of `serve`, not `serve`).
    served = serving_pids(server)
    assert len(served) == 2, served
    assert served <= children
    # One scrape, answered by one HTTP process, counts what every process did.
    assert metric_sum(scraped, "webhook_inbox_deliveries_total", 'outcome="accepted"') == 200
    assert metric_sum(scraped, "webhook_inbox_deliveries_total", 'outcome="duplicate"') == 200
    assert metric_sum(scraped, "webhook_inbox_attempts_total", 'outcome="processed"') == 200


def metric_sum(text: str, name: str, label: str) -> float:
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name + "{") and label in line
    )


async def test_two_server_processes_share_the_embedded_database(embedded_home: Path) -> None:
    # No DATABASE_URL: `serve` starts the embedded PostgreSQL under INBOX_DATA_DIR and hands
    # its URL to the processes it starts.
    ids = [f"embedded-{i}" for i in range(60)]
    with two_processes(embedded_home) as server:
        events = server.log_events()
        (started,) = [
            e for e in events if e.get("event") == "database" and e["role"] == "supervisor"
        ]
        assert str(embedded_home) in started["url"]
        db = await asyncpg.connect(asyncpg_dsn(started["url"]))
        try:
            await create_effects(db)
            await wait_listening(db, 2)
            answers = await deliver_each_twice(server.url, ids)
            await assert_effects_once(db, ids)
        finally:
            await db.close()
    assert_recorded_once(answers)
    assert len(serving_pids(server)) == 2
