"""Ordering keys under faults (issue 63): 50 keys x 40 messages posted through a real
`serve --no-worker`, a tenth of them delivered twice and a fifth failing their first attempt,
drained by three real `webhook-inbox worker` processes, one SIGKILLed while it holds claims.
Each key's effects still come in acceptance order, one at a time, once each, none lost."""

from __future__ import annotations

import asyncio
from pathlib import Path

import asyncpg
import httpx
import pytest

from tests.e2e.test_ordering import (
    KEYS,
    PER_KEY,
    PROCESSED,
    TOTAL,
    assert_in_order_and_apart,
    kill_while_holding_claims,
    start_three,
)
from tests.handlers import fails_first
from tests.processing_helpers import wait_until
from tests.server import handler_source, http_only
from tests.worker_process import stop

pytestmark = pytest.mark.slow

TOML = handler_source(
    "record_span_failing_first",
    name="hooks",
    id_header="X-Message-Id",
    ordering_key="/key",
    max_attempts=10,
    backoff_base_seconds=0.05,
    backoff_max_seconds=0.2,
)
SENDERS = 10
# Each key's messages n with n % 10 == 3 are delivered again after its message n + 2: a tenth
# of the messages, some redelivered while pending, some after they were processed.
REDELIVERED, REDELIVERY_LAG = 3, 2


def message_id(key: int, n: int) -> str:
    return f"k{key}-{n}"


def deliveries(key: int) -> list[tuple[int, bool]]:
    """Key `key`'s deliveries in the order they are sent: (n, whether a redelivery)."""
    sent: list[tuple[int, bool]] = []
    for n in range(PER_KEY):
        sent.append((n, False))
        if n >= REDELIVERY_LAG and (n - REDELIVERY_LAG) % 10 == REDELIVERED:
            sent.append((n - REDELIVERY_LAG, True))
    return sent


async def deliver_all(url: str) -> dict[str, list[tuple[str, int | None]]]:
    """Every key's deliveries, each key's one after another (each acknowledged before the
    next is sent, so its acceptance order is its send order), the keys interleaved over
    SENDERS concurrent clients. Returns each key's answers in order: (status, inbox id)."""
    answers: dict[str, list[tuple[str, int | None]]] = {f"k{k}": [] for k in range(KEYS)}
    limits = httpx.Limits(max_connections=SENDERS)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=30) as client:

        async def sender(keys: list[int]) -> None:
            for step in zip(*(deliveries(k) for k in keys), strict=True):
                for key, (n, _) in zip(keys, step, strict=True):
                    reply = await client.post(
                        "/webhooks/hooks",
                        json={"key": f"k{key}", "n": n},
                        headers={"x-message-id": message_id(key, n)},
                    )
                    assert reply.status_code == 200, reply.text
                    body = reply.json()
                    answers[f"k{key}"].append((body["status"], body.get("id")))

        await asyncio.gather(*(sender(list(range(j, KEYS, SENDERS))) for j in range(SENDERS)))
    return answers


async def test_a_sigkill_redeliveries_and_failures_leave_every_key_ordered_and_once(
    database_url: str, db: asyncpg.Connection, tmp_path: Path
) -> None:
    with http_only(tmp_path, database_url, TOML) as ingest:
        workers = await start_three(database_url, db, tmp_path, TOML)
        posting = asyncio.create_task(deliver_all(ingest.url))
        try:
            await kill_while_holding_claims(db, workers[0], at_least=5)
            answers = await posting
            await wait_until(db, PROCESSED, TOTAL, 120)
        finally:
            posting.cancel()  # a no-op once it is done
            for w in workers:  # the killed one too, should the kill not have come
                await stop(w)
    # Ingest: a first delivery accepted, a redelivery a no-op, each key's ids in send order.
    sent = [d for k in range(KEYS) for d in deliveries(k)]
    redelivered = sum(again for _, again in sent)
    assert redelivered == TOTAL // 10
    for key, replies in answers.items():
        expected = [again for _, again in deliveries(int(key[1:]))]
        assert [status == "duplicate" for status, _ in replies] == expected, key
        ids = [inbox_id for status, inbox_id in replies if status == "accepted"]
        assert len(ids) == PER_KEY, key
        assert ids == sorted(ids), f"{key} accepted out of order"
    stored = await db.fetchval("SELECT count(*) FROM inbox_messages")
    received = await db.fetchval(
        "SELECT (SELECT sum(receive_count) FROM inbox_messages)"
        " + (SELECT coalesce(sum(received), 0) FROM inbox_receipts)"
    )
    assert (stored, received) == (TOTAL, TOTAL + redelivered)
    # Processing: in acceptance order, apart, once each, none lost (or dead).
    await assert_in_order_and_apart(db)
    failing = [message_id(k, n) for k in range(KEYS) for n in range(PER_KEY)]
    failing = [m for m in failing if fails_first(m)]
    retried = await db.fetchval(
        "SELECT count(*) FROM inbox_messages WHERE message_id = ANY($1) AND attempts >= 2",
        failing,
    )
    abandoned = await db.fetchval("SELECT count(*) FROM inbox_attempts WHERE outcome = 'abandoned'")
    print(
        f"{TOTAL} messages, {redelivered} redelivered, {len(failing)} failing once, "
        f"{abandoned} attempts abandoned by the SIGKILL"
    )
    assert TOTAL // 10 < len(failing) < TOTAL * 3 // 10  # about a fifth
    assert retried == len(failing)  # each failed (or was cut short), then succeeded
    assert abandoned > 0  # the kill landed inside a batch
