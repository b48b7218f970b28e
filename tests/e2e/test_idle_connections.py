"""Idle connections cannot take ingest down (issue 11 item 4), on the real server process.

Before: uvicorn counted every open connection against INBOX_MAX_CONNECTIONS, and a connection
that had sent no request had no timeout, so 2,000 idle sockets made every healthy sender get
a plain-text 503 (0 of 10 accepted), and none of the sockets was ever closed.
"""

from __future__ import annotations

import asyncio
import json
import resource
import time
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import httpx
import pytest

from service.api.head_limits import REQUEST_HEAD_TIMEOUT_SECONDS
from service.core.db import asyncpg_dsn
from tests.server import ServerProcess, http_only

pytestmark = pytest.mark.slow

IDLE_SOCKETS = 2_000
PARTIAL_HEAD = b"POST /webhooks/s HTTP/1.1\r\nHost: x\r\nX-Id: slow"


def raise_fd_limit(needed: int) -> None:
    """Room for this many sockets here and in the server (which inherits the limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        if hard != resource.RLIM_INFINITY and hard < needed:
            pytest.skip(f"needs {needed} file descriptors; the hard limit is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))


def start_server(database_url: str, workdir: Path, **env: str) -> ServerProcess:
    return http_only(
        workdir, database_url, '[sources.s]\nkind = "generic"\nid_header = "x-id"\n', **env
    )


@pytest.fixture
def server(database_url: str, tmp_path: Path) -> Iterator[ServerProcess]:
    raise_fd_limit(2 * IDLE_SOCKETS + 1_000)
    with start_server(database_url, tmp_path) as running:  # INBOX_MAX_CONNECTIONS: 1000
        yield running


Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def open_idle(port: int, count: int) -> list[Connection]:
    """`count` connections, every fourth having sent part of a head, the rest nothing."""
    opened = []
    for batch in range(0, count, 200):
        pairs = await asyncio.gather(
            *(asyncio.open_connection("127.0.0.1", port) for _ in range(min(200, count - batch)))
        )
        for i, (_, writer) in enumerate(pairs):
            if i % 4 == 0:
                writer.write(PARTIAL_HEAD)
        opened += pairs
    return opened


async def closed_by_server(reader: asyncio.StreamReader, within: float) -> bytes | None:
    """What the server sent before closing (b"" for nothing), or None if it kept it open."""
    try:
        return await asyncio.wait_for(reader.read(), within)
    except TimeoutError:
        return None
    except ConnectionError:
        return b""


async def test_idle_sockets_neither_refuse_a_sender_nor_stay_open(
    server: ServerProcess, db: asyncpg.Connection
) -> None:
    idle = await open_idle(server.port, IDLE_SOCKETS)
    opened_at = time.monotonic()
    latencies = []
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as client:
        for i in range(10):
            started = time.perf_counter()
            reply = await client.post("/webhooks/s", content=b"{}", headers={"x-id": f"ok-{i}"})
            latencies.append(time.perf_counter() - started)
            assert reply.status_code == 200, reply.text
            assert reply.json()["status"] == "accepted"
    print(f"{IDLE_SOCKETS} idle sockets: 10 deliveries, slowest {max(latencies) * 1000:.0f} ms")
    assert max(latencies) < 1.0
    assert await db.fetchval("SELECT count(*) FROM inbox_messages") == 10

    # Every idle socket is closed by the server: the oldest to make room, the rest when
    # the head timeout runs out; a socket that had begun a head is told so with a 408.
    deadline = REQUEST_HEAD_TIMEOUT_SECONDS + 5 - (time.monotonic() - opened_at)
    answers = await asyncio.gather(*(closed_by_server(r, deadline) for r, _ in idle))
    closed_at = time.monotonic() - opened_at
    assert sum(a is None for a in answers) == 0, "idle sockets the server kept open"
    partial = [a for i, a in enumerate(answers) if i % 4 == 0 and a]
    assert all(a.startswith(b"HTTP/1.1 408") for a in partial)
    print(f"all {IDLE_SOCKETS} idle sockets closed by the server within {closed_at:.1f} s")
    for _, writer in idle:
        writer.close()


async def test_a_refusal_when_every_connection_is_busy_is_a_problem_with_retry_after(
    database_url: str, tmp_path: Path, db: asyncpg.Connection
) -> None:
    env = {"INBOX_MAX_CONNECTIONS": "3", "INBOX_DB_TIMEOUT_SECONDS": "1"}
    with start_server(database_url, tmp_path, **env) as server:
        blocker = await asyncpg.connect(asyncpg_dsn(database_url))
        tx = blocker.transaction()
        await tx.start()
        await blocker.execute("LOCK TABLE inbox_messages IN ACCESS EXCLUSIVE MODE")
        try:
            async with httpx.AsyncClient(base_url=server.url, timeout=10) as client:
                # Three requests wait on the stalled database: every allowed connection busy.
                stuck = [
                    asyncio.ensure_future(
                        client.post("/webhooks/s", content=b"{}", headers={"x-id": f"s-{i}"})
                    )
                    for i in range(3)
                ]
                await asyncio.sleep(0.5)
                started = time.perf_counter()
                refused = await client.post("/webhooks/s", content=b"{}", headers={"x-id": "4"})
                refused_after = time.perf_counter() - started
                admitted = await asyncio.gather(*stuck)
        finally:
            await tx.rollback()
            await blocker.close()
    # The three were taken (and answered 503 only when the stalled database timed them out);
    # the fourth was refused at once, as a problem a sender knows to retry.
    assert [json.loads(r.content)["detail"] for r in admitted] == [
        "the database is unavailable; nothing was recorded"
    ] * 3
    assert refused.status_code == 503
    assert refused.headers["content-type"] == "application/problem+json"
    assert int(refused.headers["retry-after"]) > 0
    assert "busy" in json.loads(refused.content)["detail"]
    assert refused_after < 0.5
