"""Two webhook-inbox services talking through the outbox (issue 65), as real `serve` processes
on two databases: service A's handler of a `PaymentCharged` stages a `StockReserved` for
service B's `standard-webhooks` source, and B's handler takes one from the sku's stock.

A's processing process is SIGKILLed three times while its handlers run, and twice more
between B's answer to a `StockReserved` and A's mark that it was sent (a proxy in front of B
kills it once B has answered and before passing the answer on); the proxy answers 503 on B's
behalf for 10 s. Every payment takes one from its sku's stock exactly once in B, none is
lost, and each request A sent again after B had answered it is counted by B as a duplicate.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
import httpx
import pytest

from service.core.db import asyncpg_dsn
from service.serve import child_title
from tests.e2e.test_isolation import children_titled
from tests.http_server import read_request
from tests.pg import create_database, drop_database, with_database
from tests.processing_helpers import create_effects, wait_until
from tests.server import ServerProcess, handler_source, serve_env
from tests.worker_process import wait_listening

pytestmark = pytest.mark.slow

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
PAYMENTS = 2000
SKUS = 20
STOCK = 1000
OUTAGE_SECONDS = 10.0
# A's handlers have run this many payments when its processing process is killed mid-run.
KILL_HANDLERS_AT = (300, 800, 1300)
# B has answered this many requests when the proxy kills A's relay before passing one on.
KILL_RELAY_AT = (500, 1500)
OUTAGE_AT = 1000  # B has answered this many when the 503s begin

LEASE = {"INBOX_WORKER_LEASE_MARGIN_SECONDS": "1"}


def service_a(proxy_url: str) -> str:
    payments = handler_source(
        "reserve_stock",
        name="payments",
        max_attempts=10,
        backoff_base_seconds=0.05,
        backoff_max_seconds=0.5,
    )
    return payments + (
        "\n[endpoints.inventory]\n"
        f'url = "{proxy_url}"\n'
        f'secret = "{SECRET}"\n'
        "timeout_seconds = 5\n"
        "max_attempts = 10\n"
        "backoff_base_seconds = 0.1\n"
        "backoff_max_seconds = 1\n"
        "breaker_failures = 5\n"
        "breaker_cooldown_seconds = 1\n"
    )


SERVICE_B = f"""
[sources.stock]
kind = "standard-webhooks"
secrets = ["{SECRET}"]
handlers = ["tests.handlers:decrement_stock"]
"""


@dataclass
class Proxy:
    """In front of B: passes A's requests on and B's answers back, counting B's answers per
    `webhook-id`. Once B has answered `outage_at` requests, it answers 503 itself for
    `OUTAGE_SECONDS`; once B has answered each of `kill_at`'s counts, it calls `kill` after
    B's next 2xx and drops the connection instead of answering. Both are judged here, as each
    answer comes, not by a look from outside that a fast relay could outrun."""

    target: str
    client: httpx.AsyncClient
    answered: Counter[str] = field(default_factory=Counter)
    kill: Callable[[], list[int]] | None = None
    kill_at: list[int] = field(default_factory=list)
    killed_after: list[str] = field(default_factory=list)
    outage_at: int | None = None
    down_until: float = 0.0
    refused: int = 0
    port: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/stock"

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while (request := await read_request(reader)) is not None:
                headers, body = request
                if self.outage_at is not None and sum(self.answered.values()) >= self.outage_at:
                    self.outage_at = None
                    self.down_until = time.monotonic() + OUTAGE_SECONDS
                if time.monotonic() < self.down_until:
                    self.refused += 1
                    status, reply = 503, b"B is down"
                else:
                    passed = {k: v for k, v in headers.items() if k not in ("host", "connection")}
                    answer = await self.client.post(self.target, content=body, headers=passed)
                    status, reply = answer.status_code, answer.content
                    if 200 <= status < 300:  # B recorded it (first time, or a duplicate)
                        self.answered[headers["webhook-id"]] += 1
                    due = self.kill_at and sum(self.answered.values()) >= self.kill_at[0]
                    if due and self.kill is not None and 200 <= status < 300 and self.kill():
                        self.kill_at.pop(0)
                        self.killed_after.append(headers["webhook-id"])
                        return  # B answered; A never hears it
                head = f"HTTP/1.1 {status} Proxied\r\nContent-Length: {len(reply)}\r\n\r\n"
                writer.write(head.encode() + reply)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()


@asynccontextmanager
async def proxy_to(target: str) -> AsyncIterator[Proxy]:
    async with httpx.AsyncClient(timeout=30) as client:
        proxy = Proxy(target, client)
        listener = await asyncio.start_server(proxy.handle, "127.0.0.1", 0)
        proxy.port = listener.sockets[0].getsockname()[1]
        try:
            yield proxy
        finally:
            listener.close()


@pytest.fixture
async def b_database_url(pg_server: str, template_db: str) -> AsyncIterator[str]:
    """Service B's own database (service A has the test's `database_url`)."""
    name = await create_database(pg_server, template=template_db)
    yield with_database(pg_server, name)
    await drop_database(pg_server, name)


def kill_processing(server: ServerProcess) -> list[int]:
    """SIGKILL every processing process of `server` (its supervisor starts new ones)."""
    killed = []
    for child in children_titled(server, child_title("processing")):
        child.send_signal(signal.SIGKILL)
        killed.append(child.pid)
    return killed


async def pay(url: str, count: int) -> None:
    """`count` PaymentCharged deliveries to A, 16 at a time; each must be accepted."""
    gate = asyncio.Semaphore(16)
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:

        async def one(i: int) -> None:
            async with gate:
                body = f'{{"id": "p{i}", "sku": "sku-{i % SKUS}"}}'.encode()
                headers = {"x-id": f"p{i}", "content-type": "application/json"}
                reply = await client.post("/webhooks/payments", content=body, headers=headers)
                assert reply.status_code == 200, reply.text

        await asyncio.gather(*(one(i) for i in range(count)))


async def test_two_services_through_the_outbox_apply_each_payment_once_through_kills(
    database_url: str, b_database_url: str, db: asyncpg.Connection, tmp_path: Path
) -> None:
    b_db = await asyncpg.connect(asyncpg_dsn(b_database_url))
    try:
        await create_effects(db)
        await create_effects(b_db)
        await b_db.execute("CREATE TABLE stock (sku text PRIMARY KEY, count integer NOT NULL)")
        await b_db.executemany(
            "INSERT INTO stock VALUES ($1, $2)", [(f"sku-{n}", STOCK) for n in range(SKUS)]
        )
        (tmp_path / "a").mkdir()
        (tmp_path / "b").mkdir()
        b_env = serve_env(tmp_path / "b", SERVICE_B, DATABASE_URL=b_database_url, **LEASE)
        with ServerProcess(b_env, tmp_path / "b") as b:
            async with proxy_to(f"{b.url}/webhooks/stock") as proxy:
                a_env = serve_env(
                    tmp_path / "a", service_a(proxy.url), DATABASE_URL=database_url, **LEASE
                )
                with ServerProcess(a_env, tmp_path / "a") as a:
                    await wait_listening(db, 1)
                    kills = await run_with_faults(a, proxy, db)
                    await wait_until(b_db, B_PROCESSED, PAYMENTS, 180)
                    await wait_until(db, A_SENT, PAYMENTS, 60)
        await check_each_payment_applied_once(db, b_db, proxy, kills)
    finally:
        await b_db.close()


B_PROCESSED = "SELECT count(*) FROM inbox_messages WHERE status = 'processed'"
A_SENT = (
    "SELECT count(*) FROM inbox_messages WHERE source = 'outbox:inventory' AND status = 'processed'"
)
A_HANDLED = "SELECT count(*) FROM effects"


async def run_with_faults(a: ServerProcess, proxy: Proxy, db: asyncpg.Connection) -> list[int]:
    """Pay, and meanwhile: kill A's handlers three times, its relay twice, and turn B away
    for `OUTAGE_SECONDS`. The processes killed."""
    paying = asyncio.create_task(pay(a.url, PAYMENTS))
    killed: list[int] = []
    handler_kills = list(KILL_HANDLERS_AT)

    def kill_relay() -> list[int]:
        found = kill_processing(a)
        killed.extend(found)
        return found

    proxy.kill, proxy.kill_at, proxy.outage_at = kill_relay, list(KILL_RELAY_AT), OUTAGE_AT
    async with asyncio.timeout(240):
        while handler_kills or proxy.kill_at or proxy.outage_at is not None:
            if handler_kills and await db.fetchval(A_HANDLED) >= handler_kills[0]:
                found = kill_processing(a)  # none while the last one is being restarted
                if found:
                    handler_kills.pop(0)
                    killed += found
            await asyncio.sleep(0.02)  # a look at the counts every 20 ms
        await paying
    return killed


async def check_each_payment_applied_once(
    db: asyncpg.Connection, b_db: asyncpg.Connection, proxy: Proxy, killed: list[int]
) -> None:
    assert len(killed) >= len(KILL_HANDLERS_AT) + len(KILL_RELAY_AT), killed
    assert len(proxy.killed_after) == len(KILL_RELAY_AT)
    assert proxy.refused > 0  # the outage turned requests away
    # A: every payment handled once, and its StockReserved sent; none dead.
    assert await db.fetchval("SELECT count(DISTINCT message_id) FROM effects") == PAYMENTS
    assert await db.fetchval("SELECT count(*) FROM effects") == PAYMENTS
    statuses = await db.fetch("SELECT source, status, count(*) FROM inbox_messages GROUP BY 1, 2")
    assert {(r["source"], r["status"]): r["count"] for r in statuses} == {
        ("payments", "processed"): PAYMENTS,
        ("outbox:inventory", "processed"): PAYMENTS,
    }
    # B: one message per payment, each applied once; the stock down by exactly the payments.
    assert await b_db.fetchval("SELECT count(*) FROM inbox_messages") == PAYMENTS
    applied = await b_db.fetch(
        "SELECT payload->>'payment' AS payment, count(*) FROM effects GROUP BY 1"
    )
    assert {r["payment"] for r in applied} == {f"p{i}" for i in range(PAYMENTS)}
    assert {r["count"] for r in applied} == {1}
    stock = {r["sku"]: r["count"] for r in await b_db.fetch("SELECT sku, count FROM stock")}
    assert stock == {f"sku-{n}": STOCK - PAYMENTS // SKUS for n in range(SKUS)}
    # Every request B answered is a first delivery or a duplicate B counted as one.
    received = await b_db.fetch("SELECT message_id, receive_count FROM inbox_messages")
    counts = {r["message_id"]: r["receive_count"] for r in received}
    assert counts == dict(proxy.answered)
    # Those answered as A's relay was killed were sent again, and B saw them as duplicates.
    for key in proxy.killed_after:
        assert counts[key] >= 2, key
    repeats = sum(counts.values()) - PAYMENTS
    print(f"{len(killed)} processes killed, {proxy.refused} turned away, {repeats} duplicates")
    # And B ran its handler once per message, whatever it was sent.
    assert await b_db.fetchval("SELECT count(*) FROM inbox_attempts") == PAYMENTS
