"""Flow control as one design (issue 63): every gate on every kind of destination, each cell
checked by behaviour: the gate holds, nothing is lost, nothing is applied twice.

Kinds: a source's Python handlers, a source's forward, a named handler destination, a named
forward destination. Gates: an ordering key, a rate limit, a pause, a circuit breaker. A
breaker guards an HTTP endpoint, so it is configured on forwards only: the handler kinds have
no breaker cell (a handler's failure is the message's, retried with backoff).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import asyncpg
import httpx
import pytest

from tests.admin_seed import AUTH, TOKEN
from tests.conftest import AppFactory
from tests.http_server import ScriptedServer, scripted_server
from tests.processing_helpers import delivery, source, wait_until

KINDS = ["handlers", "forward", "named handlers", "named forward"]
RECORD = "tests.handlers:record"
MESSAGES = 12
RATE = 5.0


@dataclass
class Kind:
    """One kind of destination under test: the source's configuration, where its effects are
    seen (the effects table or the endpoint's requests), in order."""

    name: str
    endpoint: ScriptedServer

    @property
    def forwards(self) -> bool:
        return "forward" in self.name

    @property
    def named(self) -> bool:
        return self.name.startswith("named")

    def config(self, gate: dict[str, Any], destination_gate: dict[str, Any]) -> dict[str, Any]:
        """The source with `gate` on the source, or (a named destination) `destination_gate`
        on its one destination; a forward's breaker settings go in `gate["forward"]`."""
        forward = {"url": self.endpoint.url, "timeout_seconds": 2, **gate.pop("forward", {})}
        target: dict[str, Any] = {"forward": forward} if self.forwards else {"handlers": [RECORD]}
        if self.named:
            return {
                "sources": {
                    "hooks": source(destinations={"d": {**target, **destination_gate}}, **gate)
                }
            }
        return {"sources": {"hooks": {**source(), **target, **gate, **destination_gate}}}

    async def seen(self, db: asyncpg.Connection) -> list[str]:
        """The message ids whose effect applied (or which were forwarded with a 2xx), in the
        order it happened."""
        if not self.forwards:
            return [
                r["message_id"]
                for r in await db.fetch("SELECT message_id FROM effects ORDER BY id")
            ]
        ok = [r for r in self.endpoint.requests if r.status < 300]
        return [json.loads(r.body)["id"] for r in ok]


@asynccontextmanager
async def kind_of(name: str) -> AsyncIterator[Kind]:
    async with scripted_server() as endpoint:
        yield Kind(name, endpoint)


async def send(
    client: httpx.AsyncClient, ids: list[str], body: Callable[[str], dict[str, Any]]
) -> None:
    for message_id in ids:
        sent = await client.post(
            "/webhooks/hooks",
            content=json.dumps(body(message_id)).encode(),
            headers=delivery(message_id),
        )
        assert sent.status_code == 200, sent.text


async def all_done(db: asyncpg.Connection, count: int, timeout: float = 30) -> None:
    await wait_until(
        db, "SELECT count(*) FROM inbox_messages WHERE status = 'processed'", count, timeout
    )


def assert_once_each(seen: list[str], ids: list[str]) -> None:
    assert sorted(seen) == sorted(ids), seen  # nothing lost, nothing twice


@pytest.mark.parametrize("name", KINDS)
async def test_an_ordering_key_runs_each_keys_messages_in_acceptance_order(
    name: str, worker_for: AppFactory, db: asyncpg.Connection
) -> None:
    ids = [f"m-{i:02}" for i in range(MESSAGES)]
    async with kind_of(name) as kind:
        config = kind.config({"ordering_key": "/key"}, {})
        async with worker_for(config) as client:
            await send(client, ids, lambda m: {"id": m, "key": f"k{int(m[2:]) % 3}"})
            await all_done(db, MESSAGES)
        seen = await kind.seen(db)
    assert_once_each(seen, ids)
    for key in range(3):
        of_key = [m for m in seen if int(m[2:]) % 3 == key]
        assert of_key == sorted(of_key), (key, seen)


@pytest.mark.parametrize("name", KINDS)
async def test_a_rate_limit_paces_the_runs_and_spends_no_attempt(
    name: str, worker_for: AppFactory, db: asyncpg.Connection
) -> None:
    ids = [f"m-{i:02}" for i in range(MESSAGES)]
    limit = {"rate_limit": f"{RATE:g}/s"}
    async with kind_of(name) as kind:
        config = kind.config({} if kind.named else dict(limit), limit if kind.named else {})
        async with worker_for(config) as client:
            started = time.monotonic()
            await send(client, ids, lambda m: {"id": m})
            await all_done(db, MESSAGES)
            took = time.monotonic() - started
        seen = await kind.seen(db)
    assert_once_each(seen, ids)
    # A full bucket (one second's worth), then RATE a second: the rest took that long at least.
    assert took >= (MESSAGES - RATE) / RATE * 0.8, took
    assert (
        await db.fetchval("SELECT count(*) FROM inbox_attempts WHERE outcome <> 'processed'") == 0
    )


@pytest.mark.parametrize("name", KINDS)
async def test_a_pause_holds_every_message_until_resumed(
    name: str, worker_for: AppFactory, db: asyncpg.Connection
) -> None:
    ids = [f"m-{i:02}" for i in range(MESSAGES)]
    async with kind_of(name) as kind:
        async with worker_for(kind.config({}, {}), admin_tokens=[TOKEN]) as client:
            pause = {"operator": "Ada", "reason": "downstream maintenance"}
            paused = await client.post("/admin/sources/hooks/pause", json=pause, headers=AUTH)
            assert paused.status_code == 200, paused.text
            await send(client, ids, lambda m: {"id": m})
            await wait_until(db, "SELECT count(*) FROM inbox_messages", MESSAGES)
            await asyncio.sleep(1.0)  # a window of polls and notifications: nothing must run
            held = await db.fetchval("SELECT count(*) FROM inbox_attempts")
            before = await kind.seen(db)
            resumed = await client.post("/admin/sources/hooks/resume", headers=AUTH)
            assert resumed.status_code == 200, resumed.text
            await all_done(db, MESSAGES)
        seen = await kind.seen(db)
    assert (held, before) == (0, [])
    assert_once_each(seen, ids)


@pytest.mark.parametrize("name", [k for k in KINDS if "forward" in k])
async def test_a_breaker_holds_an_endpoint_that_is_down_and_no_message_dies_of_it(
    name: str, worker_for: AppFactory, db: asyncpg.Connection
) -> None:
    ids = [f"m-{i:02}" for i in range(MESSAGES)]
    breaker = {"breaker_failures": 2, "breaker_cooldown_seconds": 1}
    async with kind_of(name) as kind:
        kind.endpoint.script.extend([(503, {})] * 1000)
        config = kind.config({"forward": breaker, "max_attempts": 3}, {})
        async with worker_for(config) as client:
            started = time.monotonic()
            await send(client, ids, lambda m: {"id": m})
            # Down for 4 s: two failures open it, then a probe a second at most.
            while time.monotonic() - started < 4:
                dead = await db.fetchval(
                    "SELECT count(*) FROM inbox_messages WHERE status = 'dead'"
                )
                assert dead == 0
                await asyncio.sleep(0.1)  # a look every 100 ms through the outage
            during = len(kind.endpoint.requests)
            kind.endpoint.script.clear()  # back
            await all_done(db, MESSAGES)
        seen = await kind.seen(db)
    assert during <= 2 + int(4 / 1) + 1, during
    assert_once_each(seen, ids)
