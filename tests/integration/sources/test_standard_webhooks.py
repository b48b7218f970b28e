"""The standard-webhooks kind over HTTP on a real database, with requests signed by the
`standardwebhooks` library: recorded with its type, then a duplicate."""

from __future__ import annotations

import base64
import time

import asyncpg
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from tests.conftest import AppFactory
from tests.integration.sources.rows import only_row_of_a_redelivery
from tests.senders.standard_webhooks import BODY, CONFIG, NEW_SECRET, signed_request


async def test_library_signed_request_is_accepted_with_its_type(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    async with client_for(CONFIG) as client:
        response = await client.post(
            "/webhooks/sw", content=BODY, headers=signed_request(NEW_SECRET, "msg_1", BODY)
        )
        again = await client.post(
            "/webhooks/sw", content=BODY, headers=signed_request(NEW_SECRET, "msg_1", BODY)
        )
    await only_row_of_a_redelivery(db, response, again, "msg_1", "invoice.paid")


async def test_v1a_ed25519_signed_request_is_accepted_and_a_wrong_key_records_nothing(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    private = Ed25519PrivateKey.generate()
    public = "whpk_" + base64.b64encode(private.public_key().public_bytes_raw()).decode()
    config = {"sources": {"pk": {"kind": "standard-webhooks", "public_keys": [public]}}}

    def v1a_headers(key: Ed25519PrivateKey, msg_id: str) -> dict[str, str]:
        now = int(time.time())
        signature = key.sign(f"{msg_id}.{now}.".encode() + BODY)
        return {
            "webhook-id": msg_id,
            "webhook-timestamp": str(now),
            "webhook-signature": "v1a," + base64.b64encode(signature).decode(),
            "content-type": "application/json",
        }

    async with client_for(config) as client:
        accepted = await client.post(
            "/webhooks/pk", content=BODY, headers=v1a_headers(private, "m1")
        )
        forged = await client.post(
            "/webhooks/pk", content=BODY, headers=v1a_headers(Ed25519PrivateKey.generate(), "m2")
        )
    assert accepted.json()["status"] == "accepted"
    assert forged.status_code == 401
    assert forged.headers["content-type"] == "application/problem+json"
    rows = await db.fetch("SELECT message_id, headers FROM inbox_messages")
    assert [r["message_id"] for r in rows] == ["m1"]
    assert "v1a," not in str(rows[0]["headers"])  # the signature is stored redacted
    assert "webhook-signature" in str(rows[0]["headers"])
