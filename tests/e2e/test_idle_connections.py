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
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import httpx
import pytest

from service.api.head_limits import REQUEST_HEAD_TIMEOUT_SECONDS
from service.core.db import asyncpg_dsn
from tests.server import ServerProcess, http_only, timed_deliveries

pytestmark = pytest.mark.slow

IDLE_SOCKETS = 2_000
# How much later than its deadline a timer may close a socket, on a shared machine.
SLACK_SECONDS = 2.0
PARTIAL_HEAD = b"POST /webhooks/s HTTP/1.1\r\nHost: x\r\nX-Id: slow"


def raise_fd_limit(needed: int) -> None:
    """Room for this many sockets here and in the server (which inherits the limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        if hard != resource.RLIM_INFINITY and hard < needed:
            pytest.fail(f"needs {needed} file descriptors; the hard limit is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))


def start_server(database_url: str, workdir: Path, **env: str) -> ServerProcess:
    return http_only(
        workdir, database_url, '[sources.s]\nkind = "generic"\nid_header = "x-id"\n', **env
    )


@pytest.fixture
def fd_room() -> None:
    raise_fd_limit(2 * IDLE_SOCKETS + 1_000)


@pytest.fixture
def server(database_url: str, tmp_path: Path, fd_room: None) -> Iterator[ServerProcess]:
    with start_server(database_url, tmp_path) as running:  # INBOX_MAX_CONNECTIONS: 1000
        yield running


@dataclass
class Idle:
    """One socket opened and left silent (or with part of a head), and when the server closed it."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    partial: bool
    opened_at: float
    closed_after: float | None = None  # seconds from its own connect; None: still open
    answer: bytes = b""
    watcher: asyncio.Task[None] | None = None


async def open_idle(port: int, count: int, *, partial_every: int = 4) -> list[Idle]:
    """`count` connections, every `partial_every`th having sent part of a head, the rest
    nothing, opened 200 at a time, each watched for its close from the moment it opens."""
    opened: list[Idle] = []
    for batch in range(0, count, 200):
        pairs = await asyncio.gather(
            *(asyncio.open_connection("127.0.0.1", port) for _ in range(min(200, count - batch)))
        )
        now = time.monotonic()
        for i, (reader, writer) in enumerate(pairs):
            partial = (batch + i) % partial_every == 0
            if partial:
                writer.write(PARTIAL_HEAD)
            idle = Idle(reader, writer, partial, now)
            idle.watcher = asyncio.ensure_future(watch_close(idle))
            opened.append(idle)
    return opened


async def watch_close(idle: Idle) -> None:
    """Record when the server closes `idle`, and what it sent, waiting a second past the time
    it should have been closed by."""
    within = REQUEST_HEAD_TIMEOUT_SECONDS + SLACK_SECONDS + 1
    try:
        idle.answer = await asyncio.wait_for(idle.reader.read(), within)
    except TimeoutError:
        return
    except ConnectionError:
        idle.answer = b""
    idle.closed_after = time.monotonic() - idle.opened_at


async def closed_within_the_head_timeout(idle: list[Idle]) -> tuple[int, float]:
    """Wait for the server to close every socket; assert each was closed within the head
    timeout of its own connect (and a partial head told so with a 408). Returns how many were
    closed on arrival (well before their deadline: to make room) and the latest close, in
    seconds after a connect."""
    await asyncio.gather(*(one.watcher for one in idle if one.watcher is not None))
    for one in idle:
        one.writer.close()
    still_open = [one for one in idle if one.closed_after is None]
    assert not still_open, f"{len(still_open)} idle sockets the server kept open"
    latest = max(one.closed_after or 0.0 for one in idle)
    assert latest <= REQUEST_HEAD_TIMEOUT_SECONDS + SLACK_SECONDS, latest
    assert all(one.answer.startswith(b"HTTP/1.1 408") for one in idle if one.partial and one.answer)
    assert not any(one.answer for one in idle if not one.partial)
    early = REQUEST_HEAD_TIMEOUT_SECONDS - SLACK_SECONDS
    return sum((one.closed_after or 0.0) < early for one in idle), latest


async def test_idle_sockets_neither_refuse_a_sender_nor_stay_open(
    server: ServerProcess, db: asyncpg.Connection
) -> None:
    idle = await open_idle(server.port, IDLE_SOCKETS)
    latencies = await timed_deliveries(server, 10, "ok-")
    print(f"{IDLE_SOCKETS} idle sockets: 10 deliveries, slowest {max(latencies) * 1000:.0f} ms")
    assert max(latencies) < 1.0
    assert await db.fetchval("SELECT count(*) FROM inbox_messages") == 10

    # Past INBOX_MAX_CONNECTIONS (1000) open, each new connection closed the one that had
    # waited longest, at once; the thousand left were closed at the head timeout. (Issue 50
    # item 4: counted ~10 s later, only those thousand look closed; none is left open.)
    on_arrival, latest = await closed_within_the_head_timeout(idle)
    print(f"{on_arrival} closed on arrival, the rest by {latest:.1f} s after their connect")
    assert on_arrival >= IDLE_SOCKETS - 1_000 - 10  # the limit, less the senders' connections


async def test_below_the_connection_limit_every_idle_socket_is_closed_by_its_own_deadline(
    database_url: str, tmp_path: Path, fd_room: None
) -> None:
    # No room to make: every one of the 2,000 waits for its own timer.
    env = {"INBOX_MAX_CONNECTIONS": str(2 * IDLE_SOCKETS)}
    with start_server(database_url, tmp_path, **env) as server:
        idle = await open_idle(server.port, IDLE_SOCKETS, partial_every=10)
        on_arrival, latest = await closed_within_the_head_timeout(idle)
    earliest = min(one.closed_after or 0.0 for one in idle)
    print(f"{IDLE_SOCKETS} idle sockets closed {earliest:.1f}-{latest:.1f} s after their connect")
    assert on_arrival == 0
    assert earliest >= REQUEST_HEAD_TIMEOUT_SECONDS - SLACK_SECONDS


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
