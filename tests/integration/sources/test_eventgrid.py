"""The eventgrid kind over HTTP on a real database: the validation handshake, a published
sample accepted then duplicate, each event of an array on its own row, the CloudEvents schema."""

from __future__ import annotations

import json

import asyncpg

from tests.conftest import AppFactory
from tests.senders.eventgrid import BLOB_CREATED, CONFIG, HEADERS, TOKEN, VALIDATION, event


async def rows(db: asyncpg.Connection) -> list[asyncpg.Record]:
    return list(await db.fetch("SELECT * FROM inbox_messages ORDER BY id"))


async def test_validation_event_is_answered_and_records_nothing(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    headers = {**HEADERS, "aeg-event-type": "SubscriptionValidation"}
    async with client_for(CONFIG) as client:
        response = await client.post(
            f"/webhooks/grid?token={TOKEN}", content=json.dumps(VALIDATION), headers=headers
        )
        unauthenticated = await client.post(
            "/webhooks/grid", content=json.dumps(VALIDATION), headers=headers
        )
    assert response.status_code == 200
    assert response.json() == {"validationResponse": "512d38b6-c7b8-40c8-89fe-f46f9e9622b6"}
    assert unauthenticated.status_code == 401
    assert await rows(db) == []


async def test_published_sample_is_accepted_then_duplicate(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    body = json.dumps([BLOB_CREATED])
    async with client_for(CONFIG) as client:
        first = await client.post(f"/webhooks/grid?token={TOKEN}", content=body, headers=HEADERS)
        again = await client.post(f"/webhooks/grid?token={TOKEN}", content=body, headers=HEADERS)
    message_id = "831e1650-001e-001b-66ab-eeb76e069631"
    assert first.json() == {"results": [{"message_id": message_id, "status": "accepted"}]}
    assert again.json() == {"results": [{"message_id": message_id, "status": "duplicate"}]}
    (row,) = await rows(db)
    assert row["event_type"] == "Microsoft.Storage.BlobCreated"
    assert json.loads(bytes(row["body"])) == BLOB_CREATED
    assert row["receive_count"] == 2


async def test_array_with_a_duplicate_inside_stores_each_event_on_its_own_row(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    body = json.dumps([event("e1"), event("e2", "Contoso.Items.ItemSent"), event("e1")])
    async with client_for(CONFIG) as client:
        response = await client.post(f"/webhooks/grid?token={TOKEN}", content=body, headers=HEADERS)
    assert response.status_code == 200
    assert [r["status"] for r in response.json()["results"]] == [
        "accepted",
        "accepted",
        "duplicate",
    ]
    stored = await rows(db)
    assert [r["message_id"] for r in stored] == ["e1", "e2"]
    assert [json.loads(bytes(r["body"]))["id"] for r in stored] == ["e1", "e2"]
    assert stored[1]["event_type"] == "Contoso.Items.ItemSent"


async def test_cloudevents_schema_subscription(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    ce = {
        "specversion": "1.0",
        "type": "Microsoft.Storage.BlobCreated",
        "source": "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Storage/"
        "storageAccounts/acct",
        "id": "9aeb0fdf-c01e-0131-0922-9eb54906e209",
        "time": "2019-11-18T15:13:39.4589254Z",
        "data": {"api": "PutBlockList"},
    }
    async with client_for(CONFIG) as client:
        handshake = await client.options(
            "/webhooks/grid", headers={"WebHook-Request-Origin": "eventgrid.azure.net"}
        )
        response = await client.post(
            f"/webhooks/grid?token={TOKEN}",
            content=json.dumps(ce),
            headers={"content-type": "application/cloudevents+json; charset=utf-8"},
        )
    assert handshake.status_code == 200
    assert handshake.headers["webhook-allowed-origin"] == "eventgrid.azure.net"
    assert response.json()["status"] == "accepted"
    assert json.loads(response.json()["message_id"])[1] == ce["id"]
