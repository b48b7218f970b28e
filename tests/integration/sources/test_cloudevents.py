"""The cloudevents kind over HTTP on a real database, with requests the official SDK builds:
accepted then duplicate across modes and sources, a batch's answer, the OPTIONS handshake."""

from __future__ import annotations

import json

import asyncpg
from cloudevents.core.bindings.http import to_binary_event, to_structured_event
from cloudevents.core.formats.json import JSONFormat

from tests.conftest import AppFactory
from tests.integration.sources.rows import only_row_of_a_redelivery
from tests.senders.cloudevents import CONFIG, event


async def rows(db: asyncpg.Connection) -> list[asyncpg.Record]:
    return list(await db.fetch("SELECT * FROM inbox_messages ORDER BY id"))


async def test_binary_mode_is_accepted_then_duplicate(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    message = to_binary_event(event())
    async with client_for(CONFIG) as client:
        first = await client.post("/webhooks/ce", content=message.body, headers=message.headers)
        again = await client.post("/webhooks/ce", content=message.body, headers=message.headers)
    event_type = "com.example.order.created"
    row = await only_row_of_a_redelivery(db, first, again, '["/orders","A-1"]', event_type)
    assert bytes(row["body"]) == message.body  # binary mode: the body is the event's data


async def test_structured_mode_dedupes_against_binary_of_the_same_event(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    structured = to_structured_event(event("B-7"))
    binary = to_binary_event(event("B-7"))
    async with client_for(CONFIG) as client:
        first = await client.post(
            "/webhooks/ce", content=structured.body, headers=structured.headers
        )
        second = await client.post("/webhooks/ce", content=binary.body, headers=binary.headers)
    assert first.json()["status"] == "accepted"
    assert second.json()["status"] == "duplicate"
    assert len(await rows(db)) == 1


async def test_same_id_from_two_sources_is_two_messages(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    a = to_binary_event(event("same", source="/a"))
    b = to_binary_event(event("same", source="/b"))
    async with client_for(CONFIG) as client:
        ra = await client.post("/webhooks/ce", content=a.body, headers=a.headers)
        rb = await client.post("/webhooks/ce", content=b.body, headers=b.headers)
    assert ra.json()["status"] == rb.json()["status"] == "accepted"
    assert [r["message_id"] for r in await rows(db)] == ['["/a","same"]', '["/b","same"]']


async def test_batch_records_each_event_with_its_own_body_in_one_answer(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    fmt = JSONFormat()
    events = [event("c1"), event("c2"), event("c1")]
    body = b"[" + b",".join(fmt.write(e) for e in events) + b"]"
    headers = {"content-type": "application/cloudevents-batch+json"}
    async with client_for(CONFIG) as client:
        response = await client.post("/webhooks/ce", content=body, headers=headers)
    assert response.status_code == 200, response.text
    assert response.json() == {
        "results": [
            {"message_id": '["/orders","c1"]', "status": "accepted"},
            {"message_id": '["/orders","c2"]', "status": "accepted"},
            {"message_id": '["/orders","c1"]', "status": "duplicate"},
        ]
    }
    stored = await rows(db)
    assert len(stored) == 2
    assert json.loads(bytes(stored[1]["body"]))["id"] == "c2"
    assert stored[1]["content_type"] == "application/cloudevents+json"


async def test_options_abuse_protection_handshake(client_for: AppFactory) -> None:
    async with client_for(CONFIG) as client:
        any_origin = await client.options(
            "/webhooks/ce", headers={"WebHook-Request-Origin": "sender.example.com"}
        )
        listed = await client.options(
            "/webhooks/ce-hmac",
            headers={"WebHook-Request-Origin": "eventgrid.azure.net", "WebHook-Request-Rate": "5"},
        )
        unlisted = await client.options(
            "/webhooks/ce-hmac", headers={"WebHook-Request-Origin": "evil.example.com"}
        )
        no_origin = await client.options("/webhooks/ce")
        unknown = await client.options(
            "/webhooks/nope", headers={"WebHook-Request-Origin": "x.example.com"}
        )
    assert any_origin.status_code == 200
    assert any_origin.headers["webhook-allowed-origin"] == "sender.example.com"
    assert any_origin.headers["webhook-allowed-rate"] == "*"
    assert listed.status_code == 200
    assert listed.headers["webhook-allowed-origin"] == "eventgrid.azure.net"
    assert listed.headers["webhook-allowed-rate"] == "120"
    assert unlisted.status_code == 403
    assert no_origin.status_code == 405
    assert unknown.status_code == 404


async def test_options_on_a_kind_without_a_handshake_is_405(client_for: AppFactory) -> None:
    config = {"sources": {"open": {"kind": "generic", "id_header": "X-Id"}}}
    async with client_for(config) as client:
        response = await client.options(
            "/webhooks/open", headers={"WebHook-Request-Origin": "x.example.com"}
        )
    assert response.status_code == 405
    assert response.headers["allow"] == "POST"
