"""Every value a delivery gives us to store is checked where it is taken (issue 11 item 1).

An event type, message id, content type or header the database cannot hold (NUL, an unpaired
surrogate, text too long for its index) is a 400 or 431 naming the header or field, for every
kind, and stores nothing; at the limits, values are stored as sent.
"""

from __future__ import annotations

import json

import asyncpg
import httpx
import pytest

from service.sources.limits import (
    MAX_CONTENT_TYPE_LENGTH,
    MAX_EVENT_TYPE_LENGTH,
    MAX_HEADER_BYTES,
    MAX_HEADER_COUNT,
)
from tests.deliveries import FROM_HEADER, KINDS, TOKEN, delivery, refusal, stored_message_id

HOSTILE_EVENT_TYPES = {
    "NUL": "order\x00created",
    "control character": "order\x1bcreated",
    "over the limit": "t" * (MAX_EVENT_TYPE_LENGTH + 1),
    "6 KB": "order.created." * 500,
}
# Header-borne event types carry Latin-1 only; these reach body-borne ones.
BODY_ONLY_EVENT_TYPES = {"unpaired surrogate": "order.\ud800created", "C1 control": "a\x85b"}


async def post(
    client: httpx.AsyncClient, kind: str, msg_id: str, event_type: str
) -> httpx.Response:
    built = delivery(kind, msg_id, event_type)
    return await client.post(built.path, content=built.body, headers=built.headers)


async def count(db: asyncpg.Connection) -> int:
    return int(await db.fetchval("SELECT count(*) FROM inbox_messages"))


@pytest.mark.parametrize("kind", KINDS)
async def test_hostile_event_types_are_400_naming_the_field_for_every_kind(
    every_kind: httpx.AsyncClient, db: asyncpg.Connection, kind: str
) -> None:
    cases = dict(HOSTILE_EVENT_TYPES)
    if kind not in FROM_HEADER:
        cases.update(BODY_ONLY_EVENT_TYPES)
    answers = {
        name: await post(every_kind, kind, f"id-{i}", et)
        for i, (name, et) in enumerate(cases.items())
    }
    for name, response in answers.items():
        detail = refusal(kind, response)
        assert detail is not None, (name, response.text)
        assert response.status_code == (200 if kind == "dapr" else 400), (name, response.text)
        # Named by the field (or, for a control character in a header, by the header).
        assert "event type" in detail or "header" in detail, (name, detail)
    assert await count(db) == 0


@pytest.mark.parametrize("kind", KINDS)
async def test_event_types_at_the_limit_are_stored_as_sent(
    every_kind: httpx.AsyncClient, db: asyncpg.Connection, kind: str
) -> None:
    longest = "é" * (MAX_EVENT_TYPE_LENGTH - 2) + ".x"
    response = await post(every_kind, kind, "at-the-limit", longest)
    assert response.status_code == 200, response.text
    row = await db.fetchrow("SELECT message_id, event_type FROM inbox_messages")
    assert row["message_id"] == stored_message_id(kind, "at-the-limit")
    assert row["event_type"] == longest


CONFIG_TOKEN = f"?token={TOKEN}"


async def test_headers_over_the_limits_are_431_naming_the_header(
    every_kind: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    path = "/webhooks/generic-header" + CONFIG_TOKEN
    base = {"x-id": "h", "x-event-type": "t"}
    many = {**base, **{f"x-h{i}": "1" for i in range(MAX_HEADER_COUNT)}}
    too_many = await every_kind.post(path, content=b"{}", headers=many)
    large = {**base, "x-large": "v" * MAX_HEADER_BYTES}
    too_large = await every_kind.post(path, content=b"{}", headers=large)
    for response in (too_many, too_large):
        assert response.status_code == 431, response.text
        assert response.headers["content-type"] == "application/problem+json"
    assert "header fields" in too_many.json()["detail"]
    assert "x-large" in too_large.json()["detail"]
    assert await count(db) == 0

    # Just inside both limits: stored, every header with it.
    fits = {**base, **{f"x-h{i}": "1" for i in range(MAX_HEADER_COUNT - 10)}}
    fits["x-large"] = "v" * (MAX_HEADER_BYTES - len("x-large"))
    response = await every_kind.post(path, content=b"{}", headers=fits)
    assert response.status_code == 200, response.text
    stored = json.loads(await db.fetchval("SELECT headers FROM inbox_messages"))
    assert stored["x-large"] == fits["x-large"]


@pytest.mark.parametrize(
    ("headers", "detail"),
    [
        ({"x-note": b"a\x00b"}, "x-note contains control characters"),
        ({"x-note": b"a\nb"}, "x-note contains control characters"),
        ({"x note": b"v"}, "not an HTTP token"),
        ({"content-type": b"application/json;" + b"p" * MAX_CONTENT_TYPE_LENGTH}, "Content-Type"),
        ({"content-type": b"application/json\x85"}, "Content-Type"),
    ],
)
async def test_header_values_the_wire_would_refuse_are_400_when_they_reach_the_app(
    every_kind: httpx.AsyncClient, db: asyncpg.Connection, headers: dict[str, bytes], detail: str
) -> None:
    # A real HTTP server refuses most of these itself (tests/e2e/test_hostile_http.py); the app
    # refuses them too, whatever server or proxy is in front of it.
    sent = {"x-id": b"h", "x-event-type": b"t", **headers}
    response = await every_kind.post(
        "/webhooks/generic-header" + CONFIG_TOKEN, content=b"{}", headers=sent
    )
    assert response.status_code == 400, response.text
    assert detail in response.json()["detail"]
    assert await count(db) == 0


async def test_a_handshake_echoing_an_unpaired_surrogate_is_answered(
    every_kind: httpx.AsyncClient, db: asyncpg.Connection
) -> None:
    # Event Grid's validation handshake echoes the sender's code; UTF-8 cannot encode this one.
    body = json.dumps(
        [
            {
                "id": "v",
                "eventType": "Microsoft.EventGrid.SubscriptionValidationEvent",
                "data": {"validationCode": "\ud800"},
            }
        ]
    ).encode()
    response = await every_kind.post(
        "/webhooks/eventgrid" + CONFIG_TOKEN,
        content=body,
        headers={"content-type": "application/json", "aeg-event-type": "SubscriptionValidation"},
    )
    assert response.status_code == 200, response.text
    assert response.content == b'{"validationResponse":"\\ud800"}'
    assert await count(db) == 0


@pytest.mark.parametrize("kind", ["eventgrid", "cloudevents-batch"])
async def test_a_batch_event_holding_an_unpaired_surrogate_is_stored_as_its_escape(
    every_kind: httpx.AsyncClient, db: asyncpg.Connection, kind: str
) -> None:
    # Each event of a batch is stored as its own JSON; UTF-8 cannot encode this one's data.
    data = {"note": "\ud800", "city": "Zürich"}
    if kind == "eventgrid":
        body = json.dumps([{"id": "e1", "eventType": "t", "data": data}])
        path, media = "/webhooks/eventgrid", "application/json"
    else:
        event = {"specversion": "1.0", "id": "e1", "source": "/s", "type": "t", "data": data}
        body = json.dumps([event])
        path, media = "/webhooks/cloudevents-structured", "application/cloudevents-batch+json"
    response = await every_kind.post(
        path + CONFIG_TOKEN, content=body, headers={"content-type": media}
    )
    assert response.status_code == 200, response.text
    stored = await db.fetchval("SELECT body FROM inbox_messages")
    assert json.loads(stored)["data"] == data
