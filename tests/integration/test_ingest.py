"""Ingest on a real database: accepted, duplicate, concurrency, each of docs/ingest.md#responses."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
from typing import Any

import asyncpg
import pytest

from tests.conftest import AppFactory
from tests.integration.sources.rows import post_twice

SECRET = "test-secret-0123456789"

HMAC_SOURCE: dict[str, Any] = {
    "kind": "generic",
    "secrets": [SECRET],
    "id_json_pointer": "/id",
    "event_type_json_pointer": "/type",
    "hmac": {"header": "X-Signature", "prefix": "sha256="},
}
CONFIG: dict[str, Any] = {
    "sources": {
        "hooks": HMAC_SOURCE,
        "open": {"kind": "generic", "id_header": "X-Message-Id"},
    }
}


def signed(body: dict[str, Any] | bytes, secret: str = SECRET) -> tuple[bytes, dict[str, str]]:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    sig = hmac.new(secret.encode(), raw, hashlib.sha256).hexdigest()
    return raw, {"content-type": "application/json", "x-signature": f"sha256={sig}"}


async def count_rows(db: asyncpg.Connection) -> int:
    return int(await db.fetchval("SELECT count(*) FROM inbox_messages"))


async def test_first_delivery_is_accepted_and_stored_byte_for_byte(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    raw = b'{"id": "evt_1",  "type": "order.created", "note": "caf\xc3\xa9"}\n'
    body, headers = signed(raw)
    async with client_for(CONFIG) as client:
        response = await client.post("/webhooks/hooks", content=body, headers=headers)
    assert response.status_code == 200
    reply = response.json()
    assert reply["status"] == "accepted"
    assert reply["message_id"] == "evt_1"
    row = await db.fetchrow("SELECT * FROM inbox_messages WHERE id = $1", reply["id"])
    assert row is not None
    assert bytes(row["body"]) == raw
    # No handler and no forward: nothing will ever run, so it is stored processed at once.
    assert row["status"] == "processed"
    assert row["processed_at"] is not None
    assert row["event_type"] == "order.created"
    assert row["content_type"] == "application/json"
    assert row["receive_count"] == 1
    stored_headers = json.loads(row["headers"])
    assert stored_headers["x-signature"] == "[redacted]"


async def test_a_source_with_work_stores_its_messages_pending_and_wakes_the_worker(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    woken: list[str] = []
    await db.add_listener("webhook_inbox", lambda *args: woken.append(args[2]))
    config = {"sources": {"hooks": {**HMAC_SOURCE, "handlers": ["tests.handlers:record"]}}}
    body, headers = signed({"id": "evt_w", "type": "t"})
    async with client_for(config) as client:
        reply = await client.post("/webhooks/hooks", content=body, headers=headers)
    assert reply.json()["status"] == "accepted"
    row = await db.fetchrow("SELECT status, processed_at FROM inbox_messages")
    assert (row["status"], row["processed_at"]) == ("pending", None)
    await asyncio.sleep(0.1)
    assert woken  # NOTIFY: a worker picks it up without waiting for its poll


async def test_redelivery_is_a_duplicate_and_counts_the_receipt(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    body, headers = signed({"id": "evt_2", "type": "t"})
    async with client_for(CONFIG) as client:
        first, second = await post_twice(client, "/webhooks/hooks", body, headers)
    assert first.json()["status"] == "accepted"
    assert second.status_code == 200
    assert second.json() == {"status": "duplicate", "message_id": "evt_2"}
    row = await db.fetchrow(
        "SELECT receive_count, last_received_at, received_at FROM inbox_messages"
    )
    assert row is not None
    assert row["receive_count"] == 2
    assert row["last_received_at"] > row["received_at"]


async def test_same_id_on_two_sources_is_two_messages(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    body, headers = signed({"id": "shared", "type": "t"})
    async with client_for(CONFIG) as client:
        a = await client.post("/webhooks/hooks", content=body, headers=headers)
        b = await client.post("/webhooks/open", content=b"x", headers={"x-message-id": "shared"})
    assert a.json()["status"] == b.json()["status"] == "accepted"
    assert await count_rows(db) == 2


async def test_fifty_concurrent_deliveries_of_one_id_record_one_row(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    body, headers = signed({"id": "evt_race", "type": "t"})
    async with client_for(CONFIG) as client:
        responses = await asyncio.gather(
            *(client.post("/webhooks/hooks", content=body, headers=headers) for _ in range(50))
        )
    statuses = sorted(r.json()["status"] for r in responses)
    assert all(r.status_code == 200 for r in responses)
    assert statuses.count("accepted") == 1
    assert statuses.count("duplicate") == 49
    rows = await db.fetch("SELECT receive_count FROM inbox_messages")
    assert [r["receive_count"] for r in rows] == [50]


@pytest.mark.parametrize(
    ("path", "body", "headers", "status", "detail_part"),
    [
        ("/webhooks/nope", b"{}", {}, 404, "no source named 'nope'"),
        (
            "/webhooks/hooks",
            b'{"id": "a"}',
            {"content-type": "application/json"},
            401,
            "X-Signature",
        ),
        (
            "/webhooks/hooks",
            b'{"id": "a"}',
            {"content-type": "application/json", "x-signature": "sha256=00"},
            401,
            "does not match",
        ),
        ("/webhooks/open", b"x", {}, 400, "X-Message-Id"),
        ("/webhooks/open", b"x", {"x-message-id": "a" * 513}, 400, "longer than 512"),
        ("/webhooks/open", b"x", {"x-message-id": "a\x7fb"}, 400, "x-message-id contains control"),
    ],
)
async def test_rejections_are_problems_and_record_nothing(
    client_for: AppFactory,
    db: asyncpg.Connection,
    path: str,
    body: bytes,
    headers: dict[str, str],
    status: int,
    detail_part: str,
) -> None:
    async with client_for(CONFIG) as client:
        response = await client.post(path, content=body, headers=headers)
    assert response.status_code == status
    assert response.headers["content-type"] == "application/problem+json"
    problem = response.json()
    assert problem["status"] == status
    assert set(problem) == {"type", "title", "status", "detail"}
    assert detail_part in problem["detail"]
    assert await count_rows(db) == 0


@pytest.mark.parametrize(
    ("body", "detail_part"),
    [(b'{"id": "evt_1",', "not valid JSON"), ({"type": "t"}, "/id")],
    ids=["malformed JSON", "without the id field"],
)
async def test_signed_json_it_cannot_read_an_id_from_is_400_naming_why(
    client_for: AppFactory, db: asyncpg.Connection, body: dict[str, Any] | bytes, detail_part: str
) -> None:
    raw, headers = signed(body)
    async with client_for(CONFIG) as client:
        response = await client.post("/webhooks/hooks", content=raw, headers=headers)
    assert response.status_code == 400
    assert detail_part in response.json()["detail"]
    assert await count_rows(db) == 0


async def test_non_json_content_type_is_415(client_for: AppFactory, db: asyncpg.Connection) -> None:
    body, headers = signed({"id": "x", "type": "t"})
    headers["content-type"] = "text/csv"
    async with client_for(CONFIG) as client:
        response = await client.post("/webhooks/hooks", content=body, headers=headers)
    assert response.status_code == 415
    assert await count_rows(db) == 0


async def test_body_over_the_limit_is_413(client_for: AppFactory, db: asyncpg.Connection) -> None:
    async with client_for(CONFIG, max_body_bytes=2048) as client:
        declared = await client.post(
            "/webhooks/open", content=b"x" * 4096, headers={"x-message-id": "big"}
        )

        async def chunks() -> Any:
            for _ in range(8):
                yield b"y" * 512

        streamed = await client.post(
            "/webhooks/open", content=chunks(), headers={"x-message-id": "big2"}
        )
        at_limit = await client.post(
            "/webhooks/open", content=b"z" * 2048, headers={"x-message-id": "fits"}
        )
    assert declared.status_code == 413
    assert streamed.status_code == 413
    assert declared.headers["content-type"] == "application/problem+json"
    assert at_limit.status_code == 200
    assert await count_rows(db) == 1


async def test_generic_id_fallback_hashes_the_body(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    config = {"sources": {"s": {"kind": "generic", "id_fallback": "body-sha256"}}}
    async with client_for(config) as client:
        first = await client.post("/webhooks/s", content=b"payload")
        again = await client.post("/webhooks/s", content=b"payload")
    assert first.json()["message_id"] == "sha256:" + hashlib.sha256(b"payload").hexdigest()
    assert again.json()["status"] == "duplicate"


async def test_a_delivery_to_an_unknown_source_is_logged_with_its_name_made_safe(
    client_for: AppFactory, db: asyncpg.Connection, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="service.ingest")
    async with client_for(CONFIG) as client:
        typo = await client.post("/webhooks/hook", content=b"{}")
        hostile = await client.post("/webhooks/" + "x%0Aforged=1%1B" + "y" * 300, content=b"{}")
    assert typo.status_code == hostile.status_code == 404
    logged = [
        r.__dict__ for r in caplog.records if getattr(r, "outcome", "") == "rejected:unknown_source"
    ]
    assert [r["source"] for r in logged][:1] == ["hook"]
    second = logged[1]["source"]
    assert second.startswith("x\\x0aforged=1\\x1byyy")
    assert second.endswith("...")
    assert len(second) < 80
    assert second.isprintable()
    assert all(r["msg"] == "delivery" for r in logged)
    assert await count_rows(db) == 0
