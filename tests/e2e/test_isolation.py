"""`serve` runs ingest and processing in separate, supervised processes (real processes, real
PostgreSQL): a handler that kills, blocks or loses its process never takes ingest with it, and
each attempt it costs is counted."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import psutil
import pytest

from service.core.db import EmbeddedPostgres, asyncpg_dsn
from service.serve import child_title
from tests.processing_helpers import create_effects, wait_until
from tests.server import JSON_LOGS, ServerProcess, handler_source, serve_env, timed_deliveries
from tests.worker_process import wait_listening

pytestmark = pytest.mark.slow

PROCESSED = "SELECT count(*) FROM inbox_messages WHERE status = 'processed'"


def source_toml(handler: str, **extra: Any) -> str:
    return handler_source(handler, backoff_base_seconds=0.05, backoff_max_seconds=0.2, **extra)


@contextmanager
def serving(tmp_path: Path, toml: str, *args: str, **env: str) -> Iterator[ServerProcess]:
    # A crashed attempt's claim expires (and is counted) a second after it was taken.
    lease = {"INBOX_WORKER_LEASE_MARGIN_SECONDS": "1"}
    environment = serve_env(tmp_path, toml, **JSON_LOGS, **lease, **env)
    with ServerProcess(
        environment, tmp_path, args=["serve", "--port", "{port}", *args], startup_timeout=60
    ) as server:
        yield server


def children_titled(server: ServerProcess, title: str) -> list[psutil.Process]:
    """The supervisor's live children of one role: forked from it, each is known by the title
    it sets (a killed one, not yet reaped, has none)."""
    assert server.process is not None
    found = []
    for child in psutil.Process(server.process.pid).children():
        try:
            if title in child.cmdline():
                found.append(child)
        except (psutil.ZombieProcess, psutil.NoSuchProcess):
            pass
    return found


def processing_children(server: ServerProcess) -> list[psutil.Process]:
    return children_titled(server, child_title("processing"))


async def deliver(
    url: str, ids: list[str], body: bytes = b"{}", concurrency: int = 16
) -> dict[str, int]:
    """Each id once; the status each got (0: no answer)."""
    answers: dict[str, int] = {}
    gate = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:

        async def send(message_id: str) -> None:
            async with gate:
                try:
                    reply = await client.post(
                        "/webhooks/s", content=body, headers={"x-id": message_id}
                    )
                    answers[message_id] = reply.status_code
                except httpx.TransportError:
                    answers[message_id] = 0

        await asyncio.gather(*(send(i) for i in ids))
    return answers


async def test_a_handler_that_kills_its_process_goes_dead_and_spares_the_rest(
    database_url: str, db: asyncpg.Connection, tmp_path: Path
) -> None:
    await create_effects(db)
    ids = [f"ok-{i}" for i in range(199)]
    ids.insert(100, "poison")  # os._exit(1) in its handler, whenever it runs
    toml = source_toml("exit_on_poison", max_attempts=3)
    with serving(tmp_path, toml, DATABASE_URL=database_url) as server:
        await wait_listening(db, 1)
        answers = await deliver(server.url, ids)
        assert set(answers.values()) == {200}  # ingest never went down with the worker
        status = "SELECT status FROM inbox_messages WHERE message_id = 'poison'"
        await wait_until(db, status, "dead", 90)
        await wait_until(db, PROCESSED, 199, 60)
        events = server.log_events()
    attempts = await db.fetch(
        "SELECT a.attempt, a.outcome, a.error_type, a.error FROM inbox_attempts a "
        "JOIN inbox_messages m ON m.id = a.message_id WHERE m.message_id = 'poison' "
        "ORDER BY a.attempt"
    )
    assert [(a["attempt"], a["outcome"]) for a in attempts] == [
        (1, "abandoned"),
        (2, "abandoned"),
        (3, "dead"),
    ]
    assert {a["error_type"] for a in attempts} == {"AttemptNeverFinished"}
    assert all("worker process exited" in a["error"] for a in attempts)
    effects = await db.fetch("SELECT message_id, count(*) AS n FROM effects GROUP BY message_id")
    assert {r["message_id"]: r["n"] for r in effects} == dict.fromkeys(ids[:100] + ids[101:], 1)
    # The supervisor saw each death, said how the child ended, and started it again.
    exits = [e for e in events if e["event"] == "child exited; restarting it"]
    assert len(exits) == 3, exits
    assert {(e["child_role"], e["exit_status"]) for e in exits} == {("processing", "exit code 1")}
    assert {e["role"] for e in exits} == {"supervisor"}
    # After its first crash the poison message ran alone: nothing else died with it again.
    assert (
        await db.fetchval("SELECT max(attempts) FROM inbox_messages WHERE message_id <> 'poison'")
        <= 2
    )


async def test_a_processing_process_killed_mid_batch_loses_and_repeats_nothing(
    database_url: str, db: asyncpg.Connection, tmp_path: Path
) -> None:
    await create_effects(db)
    ids = [f"k-{i}" for i in range(300)]
    settings = {"INBOX_WORKER_BATCH_SIZE": "50", "INBOX_WORKER_CONCURRENCY": "1"}
    # Every handler waits for this file: the first batch claimed is still running at the kill.
    gate = tmp_path / "let-go"
    body = json.dumps({"until": str(gate)}).encode()
    with serving(
        tmp_path, source_toml("record_after_gate"), DATABASE_URL=database_url, **settings
    ) as server:
        await wait_listening(db, 1)
        answers = await deliver(server.url, ids, body=body)
        assert set(answers.values()) == {200}
        in_flight = "SELECT count(*) FROM inbox_claims"
        deadline = time.monotonic() + 30
        while await db.fetchval(in_flight) == 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        (child,) = processing_children(server)
        child.send_signal(signal.SIGKILL)
        gate.touch()
        await wait_until(db, PROCESSED, 300, 60)
        events = server.log_events()
    effects = await db.fetch("SELECT message_id, count(*) AS n FROM effects GROUP BY message_id")
    assert {r["message_id"]: r["n"] for r in effects} == dict.fromkeys(ids, 1)
    # The killed batch's attempts were counted: abandoned, then processed on the second.
    twice = await db.fetchval("SELECT count(*) FROM inbox_messages WHERE attempts = 2")
    assert 1 <= twice <= 50
    abandoned = await db.fetchval("SELECT count(*) FROM inbox_attempts WHERE outcome = 'abandoned'")
    assert abandoned == twice
    (death,) = [e for e in events if e["event"] == "child exited; restarting it"]
    assert death["exit_status"] == "killed by SIGKILL"


@asynccontextmanager
async def a_blocked_handler(
    database_url: str, db: asyncpg.Connection, tmp_path: Path
) -> AsyncIterator[tuple[ServerProcess, Path, bytes]]:
    """`serve` whose handler has been given the message "blocker" and blocks its event loop
    for good (at most 60 s) until the test touches the gate file; with that file and the body."""
    await create_effects(db)
    with serving(tmp_path, source_toml("block_loop"), DATABASE_URL=database_url) as server:
        await wait_listening(db, 1)
        gate = tmp_path / "let-go"
        body = json.dumps({"sleep": 60, "until": str(gate)}).encode()
        assert (await deliver(server.url, ["blocker"], body=body)) == {"blocker": 200}
        yield server, gate, body


async def test_a_handler_blocking_its_event_loop_does_not_slow_ingest(
    database_url: str, db: asyncpg.Connection, tmp_path: Path
) -> None:
    async with a_blocked_handler(database_url, db, tmp_path) as (server, gate, _):
        # The watchdog names the handler once the processing loop has been stuck for 1 s. (On a
        # busy machine a start-up can stall the loop too: such a block names no handler.)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            blocked = [
                e
                for e in server.log_events()
                if e["event"].startswith("event loop blocked") and e["handler"] is not None
            ]
            if blocked:
                break
            await asyncio.sleep(0.1)
        assert blocked, server.output()
        assert blocked[0]["handler"] == "tests.handlers:block_loop"
        assert blocked[0]["message_id"] == "blocker"
        assert blocked[0]["role"] == "processing"
        # Meanwhile, a light load on ingest: 100 deliveries, 20 a second.
        latencies = await timed_deliveries(server, 100, "l-", every=0.05)
        # Still in flight: claimed (its attempt counted), not finished.
        blocker = await db.fetchrow(
            "SELECT m.status, c.attempt FROM inbox_messages AS m "
            "JOIN inbox_claims AS c ON c.message_id = m.id WHERE m.message_id = 'blocker'"
        )
        assert (blocker["status"], blocker["attempt"]) == ("pending", 1)
        latencies.sort()
        assert latencies[98] < 0.1, latencies[-5:]
        assert await db.fetchval("SELECT count(*) FROM inbox_messages") == 101
        gate.touch()
        await wait_until(db, PROCESSED, 101, 60)
    assert await db.fetchval("SELECT count(*) FROM effects") == 101


async def test_sigterm_drains_both_roles_and_stops_the_embedded_database(
    embedded_home: Path,
) -> None:
    ids = [f"t-{i}" for i in range(400)]
    settings = {"INBOX_WORKER_BATCH_SIZE": "20"}
    with serving(embedded_home, source_toml("record_slowly"), **settings) as server:
        (started,) = [
            e for e in server.log_events() if e["event"] == "database" and e["role"] == "supervisor"
        ]
        db = await asyncpg.connect(asyncpg_dsn(started["url"]))
        try:
            await create_effects(db)
            await wait_listening(db, 1)
        finally:
            await db.close()
        load = asyncio.create_task(deliver(server.url, ids, concurrency=8))
        # SIGTERM once 100 deliveries have been answered (logged), however fast they came.
        while server.output().count('"delivery"') < 100:
            await asyncio.sleep(0.01)
        assert server.process is not None
        server.process.send_signal(signal.SIGTERM)
        answers = await load
        code = await asyncio.to_thread(server.process.wait, 90)
    assert code == 0
    acknowledged = {i for i, status in answers.items() if status == 200}
    assert len(acknowledged) >= 100
    pgdata = (embedded_home / "data" / "pgdata").resolve()
    # No PostgreSQL of this data directory outlives `serve`.
    leftovers = [
        p
        for p in psutil.process_iter(["name", "cmdline"])
        if p.info["name"] == "postgres" and str(pgdata) in " ".join(p.info["cmdline"] or [])
    ]
    assert leftovers == []
    embedded = EmbeddedPostgres.start(embedded_home / "data")
    try:
        db = await asyncpg.connect(asyncpg_dsn(embedded.url))
        try:
            stored = {
                r["message_id"] for r in await db.fetch("SELECT message_id FROM inbox_messages")
            }
            assert acknowledged <= stored
            # The worker drained: no attempt was left half-way.
            assert (
                await db.fetchval("SELECT count(*) FROM inbox_messages WHERE status = 'processing'")
                == 0
            )
            assert await db.fetchval("SELECT count(*) FROM inbox_claims") == 0
            effects = await db.fetch(
                "SELECT message_id, count(*) AS n FROM effects GROUP BY message_id"
            )
            assert all(r["n"] == 1 for r in effects)
            processed = await db.fetchval(PROCESSED)
            assert processed == len(effects)
        finally:
            await db.close()
    finally:
        embedded.stop()


# A handler module that notes each process importing it.
IMPORT_PROBE = """
import os
from pathlib import Path

with (Path(__file__).parent / "imported-by").open("a") as f:
    f.write(f"{os.getpid()}\\n")


async def handle(message, ctx):
    pass
"""


async def test_each_child_imports_the_handlers_afresh_and_the_supervisor_none(
    database_url: str, db: asyncpg.Connection, tmp_path: Path
) -> None:
    # Children are forked from the supervisor: were the handler modules imported there, every
    # child would share what they opened on import, and a restart would run the old code.
    (tmp_path / "import_probe.py").write_text(IMPORT_PROBE)
    importers = tmp_path / "imported-by"
    toml = source_toml("record").replace("tests.handlers:record", "import_probe:handle")
    with serving(tmp_path, toml, DATABASE_URL=database_url) as server:
        assert server.process is not None
        await wait_listening(db, 1)
        (first,) = processing_children(server)
        (http,) = children_titled(server, child_title("http"))
        first.send_signal(signal.SIGKILL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            restarted = [p for p in processing_children(server) if p.pid != first.pid]
            if restarted and str(restarted[0].pid) in importers.read_text().split():
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError(f"no processing child imported the handlers again: {importers}")
        pids = [int(line) for line in importers.read_text().split()]
    assert server.process.pid not in pids
    # The child that checked them at start, the HTTP child, and both processing children.
    assert len(set(pids)) == len(pids) == 4
    assert {http.pid, first.pid, restarted[0].pid} < set(pids)


async def test_a_redelivery_of_a_message_in_flight_does_not_stall_ingest(
    database_url: str, db: asyncpg.Connection, tmp_path: Path
) -> None:
    """A sender that redelivers a message while its handler runs (its ack was lost, or it
    retries on a timer) gets its answer, and the deliveries committed beside it theirs, without
    waiting for the handler: the batch holding the message's row locked runs for as long as
    the handler does (`handler_timeout_seconds`, 60 s by default)."""
    async with a_blocked_handler(database_url, db, tmp_path) as (server, gate, body):
        await wait_until(db, "SELECT count(*) FROM inbox_claims", 1, 15)
        latencies = []
        async with httpx.AsyncClient(base_url=server.url, timeout=10) as client:

            async def timed(message_id: str, content: bytes) -> tuple[int, float]:
                began = time.perf_counter()
                reply = await client.post(
                    "/webhooks/s", content=content, headers={"x-id": message_id}
                )
                return reply.status_code, time.perf_counter() - began

            for i in range(20):
                # The redelivery and a new message, sent together: one batch, or two at once.
                (again, took), (fresh, fresh_took) = await asyncio.gather(
                    timed("blocker", body), timed(f"l-{i}", b"{}")
                )
                assert (again, fresh) == (200, 200)
                latencies += [took, fresh_took]
                await asyncio.sleep(0.05)
            scraped = (await client.get("/metrics")).text
        assert max(latencies) < 1.0, sorted(latencies)[-5:]
        # Meanwhile the redeliveries wait beside the row the batch holds, counted when it ends.
        assert await db.fetchval("SELECT sum(received) FROM inbox_receipts") == 20
        assert "webhook_inbox_ingest_redeliveries_kept_aside_total 20.0" in scraped
        gate.touch()
        await wait_until(db, PROCESSED, 21, 60)
        counted = "SELECT receive_count FROM inbox_messages WHERE message_id = 'blocker'"
        await wait_until(db, counted, 21, 10)
        assert await db.fetchval("SELECT count(*) FROM inbox_receipts") == 0
    assert await db.fetchval("SELECT count(*) FROM effects") == 21
