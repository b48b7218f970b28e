"""Slow, broken and oversized clients against the real server process."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator

import asyncpg
import httpx
import psutil
import pytest

from service.core.db import asyncpg_dsn
from tests.e2e.conftest import emptied_module_database
from tests.server import ServerProcess, http_only

LIMIT = 1024 * 1024
BIG = 200 * 1024 * 1024


@pytest.fixture(scope="module")
def server(
    module_database: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """One server for the module's tests: each leaves it as it found it (its sockets closed)."""
    sources = '[sources.s]\nkind = "generic"\nid_header = "x-id"\n'
    settings = {"INBOX_BODY_TIMEOUT_SECONDS": "2", "INBOX_MAX_BODY_BYTES": str(LIMIT)}
    workdir = tmp_path_factory.mktemp("clients")
    with http_only(workdir, module_database, sources, **settings) as running:
        yield running


database_url = pytest.fixture(emptied_module_database, name="database_url")


def rss(server: ServerProcess) -> int:
    assert server.process is not None
    return int(psutil.Process(server.process.pid).memory_info().rss)


async def send_big_body(server: ServerProcess, chunked: bool) -> bytes:
    """Announce or stream a 200 MB body; return the first bytes of the server's answer.

    Only twice the limit is sent before the answer must arrive, so a server that waited for
    the whole body (or read on past the limit) would not answer in time. The rest of the
    200 MB is then pushed at it anyway, for the memory check.
    """
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    framing = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {BIG}"
    writer.write(f"POST /webhooks/s HTTP/1.1\r\nHost: x\r\nX-Id: big\r\n{framing}\r\n\r\n".encode())
    chunk = b"x" * (256 * 1024)
    framed = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n" if chunked else chunk

    async def push(until: int, sent: int) -> int:
        try:
            while sent < until:
                writer.write(framed)
                await writer.drain()
                sent += len(chunk)
        except (ConnectionError, OSError):
            return until
        return sent

    sent = await push(2 * LIMIT, 0)
    head = await asyncio.wait_for(reader.read(200), 10)
    await push(BIG, sent)
    writer.close()
    return head


@pytest.mark.parametrize("chunked", [True, False], ids=["chunked", "content-length"])
async def test_a_200_mb_body_is_refused_early_without_memory_growth(
    server: ServerProcess, db: asyncpg.Connection, chunked: bool
) -> None:
    before = rss(server)
    head = await send_big_body(server, chunked)
    # Answered after at most twice the limit was sent: refused at the limit, not at the end.
    assert head.startswith(b"HTTP/1.1 413"), head
    assert rss(server) - before < 50 * 1024 * 1024
    assert await db.fetchval("SELECT count(*) FROM inbox_messages") == 0
    # And it still serves.
    ok = httpx.post(f"{server.url}/webhooks/s", content=b"a", headers={"x-id": "after"})
    assert ok.json()["status"] == "accepted"


async def test_slow_clients_hold_no_database_connection_nor_delay_others(
    server: ServerProcess, database_url: str
) -> None:
    admin = await asyncpg.connect(asyncpg_dsn(database_url))
    # Connections of the service's that are doing something (not idle in its pool).
    busy_sql = (
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND pid <> pg_backend_pid() AND state <> 'idle'"
    )
    warm = httpx.post(f"{server.url}/webhooks/s", content=b"a", headers={"x-id": "warm"})
    assert warm.status_code == 200

    slow: list[socket.socket] = []
    for i in range(20):
        s = socket.create_connection(("127.0.0.1", server.port))
        if i % 2:
            s.sendall(b"POST /webhooks/s HTTP/1.1\r\nHost: x\r\nX-Id: slow\r\n")  # head unfinished
        else:
            head = b"POST /webhooks/s HTTP/1.1\r\nHost: x\r\nX-Id: slow\r\nContent-Length: 100\r\n"
            s.sendall(head + b"\r\nab")  # body unfinished
        slow.append(s)
    try:
        started = time.monotonic()
        async with httpx.AsyncClient(base_url=server.url) as client:
            replies = await asyncio.gather(
                *(
                    client.post("/webhooks/s", content=b"a", headers={"x-id": f"fast-{i}"})
                    for i in range(20)
                )
            )
        elapsed = time.monotonic() - started
        assert all(r.json()["status"] == "accepted" for r in replies)
        assert elapsed < 3, f"other senders were delayed {elapsed:.1f}s by slow clients"
        # Within a deadline, not after a fixed pause: the worker's own poll may be running.
        deadline = time.monotonic() + 5
        while await admin.fetchval(busy_sql) != 0:
            assert time.monotonic() < deadline, "a database connection stayed busy"
            await asyncio.sleep(0.05)
    finally:
        for s in slow:
            s.close()
        await admin.close()


async def test_a_trickled_body_times_out_with_408(
    server: ServerProcess, db: asyncpg.Connection
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(
        b"POST /webhooks/s HTTP/1.1\r\nHost: x\r\nX-Id: trickle\r\nContent-Length: 50\r\n\r\n"
    )
    started = time.monotonic()
    answer = asyncio.ensure_future(reader.read(200))
    for _ in range(10):
        if answer.done():
            break
        writer.write(b"x")
        await writer.drain()
        await asyncio.sleep(0.5)
    head = await asyncio.wait_for(answer, 10)
    writer.close()
    assert head.startswith(b"HTTP/1.1 408"), head
    assert time.monotonic() - started < 4
    assert await db.fetchval("SELECT count(*) FROM inbox_messages") == 0


async def test_a_client_vanishing_mid_body_records_nothing(
    server: ServerProcess, db: asyncpg.Connection
) -> None:
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        s.sendall(
            b"POST /webhooks/s HTTP/1.1\r\nHost: x\r\nX-Id: gone\r\nContent-Length: 1000\r\n\r\n"
        )
        s.sendall(b"y" * 400)
    await asyncio.sleep(0.5)
    ok = httpx.post(f"{server.url}/webhooks/s", content=b"a", headers={"x-id": "still-fine"})
    assert ok.json()["status"] == "accepted"
    ids = [r["message_id"] for r in await db.fetch("SELECT message_id FROM inbox_messages")]
    assert ids == ["still-fine"]
