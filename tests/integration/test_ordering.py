"""Ordering keys (issue 52 item 1): what ingest stores as a message's key, a failing message
holding its key's followers (and no other key's) until an operator releases it, and the
configuration's refusals."""

from __future__ import annotations

import json
from typing import Any

import asyncpg
import pytest
from cloudevents.core.formats.json import JSONFormat

from service.core.settings import ConfigError
from service.processing.pipeline import resolve_pipelines
from service.sources.config_file import parse_inbox_config
from tests.admin_seed import AUTH, TOKEN
from tests.conftest import AppFactory
from tests.processing_helpers import delivery, source, wait_until
from tests.senders.cloudevents import event


def ordered(key: str, *handlers: str, **extra: Any) -> dict[str, Any]:
    return {"sources": {"hooks": source(*handlers, ordering_key=key, **extra)}}


async def keys_of(db: asyncpg.Connection) -> dict[str, str | None]:
    return dict(await db.fetch("SELECT message_id, ordering_key FROM inbox_messages"))


async def test_ingest_stores_the_key_a_pointer_or_a_header_names(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    bodies: dict[str, Any] = {
        "text": {"data": {"customer": "cus_1"}},
        "number": {"data": {"customer": 42}},
        "flag": {"data": {"customer": True}},
        "object": {"data": {"customer": {"id": "cus_1"}}},
        "missing": {"data": {}},
        "empty": {"data": {"customer": ""}},
        "long": {"data": {"customer": "x" * 600}},
    }
    async with client_for(ordered("/data/customer")) as client:
        for message_id, body in bodies.items():
            sent = await client.post(
                "/webhooks/hooks", content=json.dumps(body).encode(), headers=delivery(message_id)
            )
            assert sent.status_code == 200, sent.text
        not_json = await client.post("/webhooks/hooks", content=b"[1,", headers=delivery("bad"))
        assert not_json.status_code == 200  # generic takes any body; it is just unordered
    keys = await keys_of(db)
    assert keys.pop("long", "").startswith("sha256:")
    assert keys == {
        "text": "cus_1",
        "number": "42",
        "flag": None,
        "object": None,
        "missing": None,
        "empty": None,
        "bad": None,
    }
    await db.execute("TRUNCATE inbox_messages")
    async with client_for(ordered("header:X-Shop-Domain")) as client:
        await client.post(
            "/webhooks/hooks",
            content=b"{}",
            headers={**delivery("h-1"), "x-shop-domain": "shop.example"},
        )
        await client.post("/webhooks/hooks", content=b"{}", headers=delivery("h-2"))
    assert await keys_of(db) == {"h-1": "shop.example", "h-2": None}


async def test_a_failing_message_holds_its_keys_followers_until_it_is_discarded(
    worker_for: AppFactory, db: asyncpg.Connection
) -> None:
    config = ordered("/key", "tests.handlers:record_unless_poison", max_attempts=2)
    async with worker_for(config, admin_tokens=[TOKEN]) as client:
        for message_id, body in [
            ("a-1", {"key": "a", "poison": True}),
            ("a-2", {"key": "a"}),
            ("b-1", {"key": "b"}),
            ("a-3", {"key": "a"}),
            ("none", {}),
        ]:
            await client.post(
                "/webhooks/hooks", content=json.dumps(body).encode(), headers=delivery(message_id)
            )
        await wait_until(db, "SELECT status FROM inbox_messages WHERE message_id = 'a-1'", "dead")
        await wait_until(
            db, "SELECT count(*) FROM inbox_messages WHERE status = 'processed'", 2
        )  # b-1 and the unordered one, not held
        ids = dict(await db.fetch("SELECT message_id, id FROM inbox_messages"))
        held = (await client.get(f"/admin/messages/{ids['a-3']}", headers=AUTH)).json()
        free = (await client.get(f"/admin/messages/{ids['b-1']}", headers=AUTH)).json()
        assert (
            await db.fetchval(
                "SELECT count(*) FROM inbox_attempts a JOIN inbox_messages m "
                "ON m.id = a.message_id WHERE m.message_id IN ('a-2', 'a-3')"
            )
            == 0
        )  # held: no attempt spent
        released = await client.post(f"/admin/messages/{ids['a-1']}/discard", headers=AUTH)
        assert released.status_code == 200
        await wait_until(db, "SELECT count(*) FROM inbox_messages WHERE status = 'processed'", 4)
    assert (held["ordering_key"], held["held_behind"]) == ("a", ids["a-1"])
    assert (free["ordering_key"], free["held_behind"]) == ("b", None)
    order = [r["message_id"] for r in await db.fetch("SELECT message_id FROM effects ORDER BY id")]
    assert order.index("a-2") < order.index("a-3")  # released in acceptance order
    assert set(order) == {"a-2", "a-3", "b-1", "none"}


@pytest.mark.parametrize(
    ("key", "extra", "error"),
    [
        ("data/customer", {}, "sources.hooks.ordering_key: an ordering key is a"),
        ("/data/~2bad", {}, "sources.hooks.ordering_key: not a JSON pointer"),
        ("header:X Shop", {}, "sources.hooks.ordering_key: 'X Shop' is not a header"),
        ("/key", {"mode": "sync"}, "sources.hooks.ordering_key: sync mode runs each message"),
    ],
)
def test_an_ordering_key_written_wrong_stops_start_up_naming_it(
    key: str, extra: dict[str, Any], error: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        resolve_pipelines(parse_inbox_config(ordered(key, "tests.handlers:record", **extra)))
    assert str(raised.value).startswith(error), str(raised.value)


async def test_one_batch_delivery_keeps_the_senders_order_within_each_key(
    worker_for: AppFactory, db: asyncpg.Connection
) -> None:
    # A CloudEvents batch whose ids sort opposite to the order the sender put them in, two
    # keys (the events' `source`) interleaved, and a key of one event.
    fmt = JSONFormat()
    sent = [("/a", "e-9"), ("/b", "e-8"), ("/a", "e-5"), ("/b", "e-4"), ("/a", "e-1")]
    events = [event(event_id, source=key) for key, event_id in sent]
    events.append(event("e-0", source="/c"))
    body = b"[" + b",".join(fmt.write(e) for e in events) + b"]"
    ce = {"kind": "cloudevents", "handlers": ["tests.handlers:record"], "ordering_key": "/source"}
    async with worker_for({"sources": {"ce": ce}}) as client:
        answer = await client.post(
            "/webhooks/ce",
            content=body,
            headers={"content-type": "application/cloudevents-batch+json"},
        )
        assert answer.status_code == 200, answer.text
        await wait_until(db, "SELECT count(*) FROM effects", len(events))
    stored = await db.fetch("SELECT message_id, ordering_key FROM inbox_messages ORDER BY id")
    by_key: dict[str, list[str]] = {}
    for row in stored:
        by_key.setdefault(row["ordering_key"], []).append(json.loads(row["message_id"])[1])
    assert by_key == {"/a": ["e-9", "e-5", "e-1"], "/b": ["e-8", "e-4"], "/c": ["e-0"]}
    effects = await db.fetch("SELECT message_id FROM effects ORDER BY id")
    applied = [tuple(json.loads(r["message_id"])) for r in effects]
    for key, ids in by_key.items():
        assert [i for k, i in applied if k == key] == ids  # run in the sender's order
