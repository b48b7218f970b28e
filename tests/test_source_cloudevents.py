"""`cloudevents` kind: requests built by the official SDK in binary, structured and batch modes."""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

import asyncpg
import pytest
from cloudevents.core.bindings.http import to_binary_event, to_structured_event
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent

from service.sources.cloudevents_http import dedup_key
from tests.conftest import AppFactory

SECRET = "ce-test-secret-0123456789"
CONFIG: dict[str, Any] = {
    "sources": {
        "ce": {"kind": "cloudevents"},
        "ce-token": {"kind": "cloudevents", "token": "ce-token-0123456789"},
        "ce-hmac": {
            "kind": "cloudevents",
            "secrets": [SECRET],
            "hmac": {"header": "X-Signature", "prefix": "sha256="},
            "allowed_origins": ["eventgrid.azure.net"],
            "allowed_rate": "120",
        },
    }
}


def event(event_id: str = "A-1", source: str = "/orders", **extra: Any) -> CloudEvent:
    attributes = {
        "type": "com.example.order.created",
        "source": source,
        "id": event_id,
        "datacontenttype": "application/json",
        **extra,
    }
    return CloudEvent(attributes, {"order": event_id})


async def rows(db: asyncpg.Connection) -> list[asyncpg.Record]:
    return list(await db.fetch("SELECT * FROM inbox_messages ORDER BY id"))


async def test_binary_mode_is_accepted_then_duplicate(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    message = to_binary_event(event())
    async with client_for(CONFIG) as client:
        first = await client.post("/webhooks/ce", content=message.body, headers=message.headers)
        again = await client.post("/webhooks/ce", content=message.body, headers=message.headers)
    assert first.status_code == 200, first.text
    assert first.json()["status"] == "accepted"
    assert first.json()["message_id"] == '["/orders","A-1"]'
    assert again.json() == {"status": "duplicate", "message_id": '["/orders","A-1"]'}
    (row,) = await rows(db)
    assert row["event_type"] == "com.example.order.created"
    assert bytes(row["body"]) == message.body  # binary mode: the body is the event's data
    assert row["receive_count"] == 2


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


def test_dedup_key_is_unambiguous() -> None:
    assert dedup_key('/x","y', "z") != dedup_key("/x", 'y","z')
    assert json.loads(dedup_key("/a b%", "é")) == ["/a b%", "é"]


async def test_percent_encoded_binary_headers_are_decoded(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    message = to_binary_event(event("id 1", source='/a b%"é'))
    assert "%20" in message.headers["ce-source"]
    async with client_for(CONFIG) as client:
        response = await client.post("/webhooks/ce", content=message.body, headers=message.headers)
    assert response.status_code == 200, response.text
    assert json.loads(response.json()["message_id"]) == ['/a b%"é', "id 1"]


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


async def test_a_bad_event_in_a_batch_records_none_of_it(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    good = json.loads(JSONFormat().write(event("ok")))
    bad = {k: v for k, v in good.items() if k != "source"}
    body = json.dumps([good, bad]).encode()
    headers = {"content-type": "application/cloudevents-batch+json"}
    async with client_for(CONFIG) as client:
        response = await client.post("/webhooks/ce", content=body, headers=headers)
    assert response.status_code == 400
    assert "'source'" in response.json()["detail"]
    assert "batch[1]" in response.json()["detail"]
    assert await rows(db) == []


@pytest.mark.parametrize("missing", ["specversion", "id", "source", "type"])
async def test_missing_required_attribute_is_400_naming_it(
    client_for: AppFactory, db: asyncpg.Connection, missing: str
) -> None:
    structured = json.loads(to_structured_event(event()).body)
    del structured[missing]
    binary = to_binary_event(event())
    headers = {k: v for k, v in binary.headers.items() if k != f"ce-{missing}"}
    async with client_for(CONFIG) as client:
        s = await client.post(
            "/webhooks/ce",
            content=json.dumps(structured).encode(),
            headers={"content-type": "application/cloudevents+json"},
        )
        b = await client.post("/webhooks/ce", content=binary.body, headers=headers)
    for response in (s, b):
        assert response.status_code == 400
        assert response.headers["content-type"] == "application/problem+json"
        assert repr(missing) in response.json()["detail"]
    assert await rows(db) == []


async def test_malformed_structured_json_and_other_formats(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    async with client_for(CONFIG) as client:
        broken = await client.post(
            "/webhooks/ce",
            content=b'{"id": ',
            headers={"content-type": "application/cloudevents+json"},
        )
        avro = await client.post(
            "/webhooks/ce",
            content=b"\x00",
            headers={"content-type": "application/cloudevents+avro"},
        )
    assert broken.status_code == 400
    assert avro.status_code == 415
    assert await rows(db) == []


async def test_token_is_required_as_bearer_or_query(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    message = to_binary_event(event("t1"))
    async with client_for(CONFIG) as client:
        none = await client.post(
            "/webhooks/ce-token", content=message.body, headers=message.headers
        )
        wrong = await client.post(
            "/webhooks/ce-token",
            content=message.body,
            headers={**message.headers, "authorization": "Bearer nope"},
        )
        bearer = await client.post(
            "/webhooks/ce-token",
            content=message.body,
            headers={**message.headers, "authorization": "Bearer ce-token-0123456789"},
        )
    assert none.status_code == wrong.status_code == 401
    assert bearer.json()["status"] == "accepted"
    assert len(await rows(db)) == 1


def sign(body: bytes, secret: str = SECRET) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


async def test_hmac_over_the_raw_body(client_for: AppFactory, db: asyncpg.Connection) -> None:
    message = to_structured_event(event("h1"))
    tampered = message.body.replace(b'"h1"', b'"h2"')
    async with client_for(CONFIG) as client:
        good = await client.post(
            "/webhooks/ce-hmac",
            content=message.body,
            headers={**message.headers, "x-signature": sign(message.body)},
        )
        body_changed = await client.post(
            "/webhooks/ce-hmac",
            content=tampered,
            headers={**message.headers, "x-signature": sign(message.body)},
        )
        wrong_key = await client.post(
            "/webhooks/ce-hmac",
            content=message.body,
            headers={**message.headers, "x-signature": sign(message.body, "other-secret-98765")},
        )
    assert good.json()["status"] == "accepted"
    assert body_changed.status_code == wrong_key.status_code == 401
    assert [r["message_id"] for r in await rows(db)] == ['["/orders","h1"]']


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
