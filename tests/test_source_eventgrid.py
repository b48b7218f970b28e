"""`eventgrid` kind: validation handshake, arrays deduped per event, query token and key header."""

from __future__ import annotations

import json
from typing import Any

import asyncpg

from tests.conftest import AppFactory

KEY = "eventgrid-key-0123456789"
TOKEN = "eventgrid-token-0123456789"
CONFIG: dict[str, Any] = {
    "sources": {
        "grid": {"kind": "eventgrid", "token": TOKEN},
        "grid-key": {"kind": "eventgrid", "key_header": "X-Grid-Key", "secrets": [KEY]},
    }
}
HEADERS = {"content-type": "application/json", "aeg-event-type": "Notification"}

# Microsoft's published sample (learn.microsoft.com, event-grid/event-schema).
BLOB_CREATED: dict[str, Any] = {
    "topic": "/subscriptions/{subscription-id}/resourceGroups/Storage/providers/"
    "Microsoft.Storage/storageAccounts/xstoretestaccount",
    "subject": "/blobServices/default/containers/oc2d2817345i200097container/blobs/"
    "oc2d2817345i20002296blob",
    "eventType": "Microsoft.Storage.BlobCreated",
    "eventTime": "2017-06-26T18:41:00.9584103Z",
    "id": "831e1650-001e-001b-66ab-eeb76e069631",
    "data": {
        "api": "PutBlockList",
        "clientRequestId": "6d79dbfb-0e37-4fc4-981f-442c9ca65760",
        "requestId": "831e1650-001e-001b-66ab-eeb76e000000",
        "eTag": "0x8D4BCC2E4835CD0",
        "contentType": "application/octet-stream",
        "contentLength": 524288,
        "blobType": "BlockBlob",
        "url": "https://oc2d2817345i60006.blob.core.windows.net/oc2d2817345i200097container/"
        "oc2d2817345i20002296blob",
        "sequencer": "00000000000004420000000000028963",
        "storageDiagnostics": {"batchId": "b68529f3-68cd-4744-baa4-3c0498ec19f0"},
    },
    "dataVersion": "",
    "metadataVersion": "1",
}
# Microsoft's published validation event (learn.microsoft.com, webhook-event-delivery).
VALIDATION: list[dict[str, Any]] = [
    {
        "id": "2d1781af-3a4c-4d7c-bd0c-e34b19da4e66",
        "topic": "/subscriptions/xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx",
        "subject": "",
        "data": {
            "validationCode": "512d38b6-c7b8-40c8-89fe-f46f9e9622b6",
            "validationUrl": "https://rp-eastus2.eventgrid.azure.net:553/eventsubscriptions/"
            "myeventsub/validate?id=0000000000-0000-0000-0000-00000000000000&t=2022-10-28T04:"
            "23:35.1981776Z&apiVersion=2018-05-01-preview&token=1A1A1A1A",
        },
        "eventType": "Microsoft.EventGrid.SubscriptionValidationEvent",
        "eventTime": "2022-10-28T04:23:35.1981776Z",
        "metadataVersion": "1",
        "dataVersion": "1",
    }
]


def event(event_id: str, event_type: str = "Contoso.Items.ItemReceived") -> dict[str, Any]:
    return {**BLOB_CREATED, "id": event_id, "eventType": event_type}


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


async def test_event_without_id_rejects_the_whole_array(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    no_id = {k: v for k, v in event("x").items() if k != "id"}
    body = json.dumps([event("ok"), no_id])
    async with client_for(CONFIG) as client:
        response = await client.post(f"/webhooks/grid?token={TOKEN}", content=body, headers=HEADERS)
    assert response.status_code == 400
    assert "[1].id" in response.json()["detail"]
    assert await rows(db) == []


async def test_wrong_token_and_malformed_body(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    body = json.dumps([event("w1")])
    async with client_for(CONFIG) as client:
        wrong = await client.post("/webhooks/grid?token=nope", content=body, headers=HEADERS)
        not_array = await client.post(
            f"/webhooks/grid?token={TOKEN}", content=json.dumps(event("w1")), headers=HEADERS
        )
        broken = await client.post(f"/webhooks/grid?token={TOKEN}", content="[{", headers=HEADERS)
    assert wrong.status_code == 401
    assert not_array.status_code == broken.status_code == 400
    assert await rows(db) == []


async def test_key_header_from_a_delivery_property(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    body = json.dumps([event("k1")])
    async with client_for(CONFIG) as client:
        good = await client.post(
            "/webhooks/grid-key", content=body, headers={**HEADERS, "x-grid-key": KEY}
        )
        wrong = await client.post(
            "/webhooks/grid-key", content=body, headers={**HEADERS, "x-grid-key": "other-key-987"}
        )
        missing = await client.post("/webhooks/grid-key", content=body, headers=HEADERS)
    assert good.json()["results"][0]["status"] == "accepted"
    assert wrong.status_code == missing.status_code == 401
    (row,) = await rows(db)
    assert json.loads(row["headers"])["x-grid-key"] == "[redacted]"


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
