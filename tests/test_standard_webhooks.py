"""standard-webhooks ingest, with requests signed by the `standardwebhooks` library itself."""

from __future__ import annotations

import base64
import json
import time
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest
from standardwebhooks.webhooks import Webhook

from service.sources.standard_webhooks import decode_secret, sign
from tests.conftest import AppFactory

OLD_SECRET = "whsec_" + base64.b64encode(b"old-key-material-0123456789abcdef").decode()
NEW_SECRET = "whsec_" + base64.b64encode(b"new-key-material-0123456789abcdef").decode()
CONFIG = {"sources": {"sw": {"kind": "standard-webhooks", "secrets": [NEW_SECRET, OLD_SECRET]}}}


def signed_request(
    secret: str, msg_id: str, body: bytes, at: datetime | None = None
) -> dict[str, str]:
    at = at or datetime.now(tz=UTC)
    signature = Webhook(secret).sign(msg_id, at, body.decode())
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(at.timestamp())),
        "webhook-signature": signature,
        "content-type": "application/json",
    }


BODY = json.dumps({"type": "invoice.paid", "data": {"amount": 42}}).encode()


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
    assert response.json()["status"] == "accepted"
    assert again.json() == {"status": "duplicate", "message_id": "msg_1"}
    assert await db.fetchval("SELECT event_type FROM inbox_messages") == "invoice.paid"


async def test_rotated_secret_still_verifies(client_for: AppFactory) -> None:
    async with client_for(CONFIG) as client:
        response = await client.post(
            "/webhooks/sw", content=BODY, headers=signed_request(OLD_SECRET, "msg_old", BODY)
        )
    assert response.json()["status"] == "accepted"


async def test_one_matching_signature_among_several_verifies(client_for: AppFactory) -> None:
    headers = signed_request(NEW_SECRET, "msg_multi", BODY)
    headers["webhook-signature"] = "v1,AAAA v1a,ignored " + headers["webhook-signature"]
    async with client_for(CONFIG) as client:
        response = await client.post("/webhooks/sw", content=BODY, headers=headers)
    assert response.json()["status"] == "accepted"


@pytest.mark.parametrize(
    ("mutate", "detail"),
    [
        (lambda h, b: (h, b + b" "), "no webhook-signature matches"),
        (
            lambda h, b: ({**h, "webhook-signature": h["webhook-signature"][:-4] + "AAA="}, b),
            "no webhook-signature matches",
        ),
        (lambda h, b: ({**h, "webhook-id": "msg_other"}, b), "no webhook-signature matches"),
        (lambda h, b: ({k: v for k, v in h.items() if k != "webhook-id"}, b), "webhook-id"),
        (
            lambda h, b: ({k: v for k, v in h.items() if k != "webhook-signature"}, b),
            "webhook-signature",
        ),
        (lambda h, b: ({**h, "webhook-timestamp": "soon"}, b), "not an integer"),
        (lambda h, b: ({**h, "webhook-signature": "v2,abc"}, b), "no v1 signature"),
    ],
)
async def test_tampering_is_401_and_records_nothing(
    client_for: AppFactory,
    db: asyncpg.Connection,
    mutate,
    detail: str,  # type: ignore[no-untyped-def]
) -> None:
    headers, body = mutate(signed_request(NEW_SECRET, "msg_t", BODY), BODY)
    async with client_for(CONFIG) as client:
        response = await client.post("/webhooks/sw", content=body, headers=headers)
    assert response.status_code == 401
    assert detail in response.json()["detail"]
    assert await db.fetchval("SELECT count(*) FROM inbox_messages") == 0


@pytest.mark.parametrize(("offset", "word"), [(-301, "too old"), (301, "future")])
async def test_timestamps_outside_tolerance_both_ways(
    client_for: AppFactory, db: asyncpg.Connection, offset: int, word: str
) -> None:
    at = datetime.now(tz=UTC) + timedelta(seconds=offset)
    async with client_for(CONFIG) as client:
        response = await client.post(
            "/webhooks/sw", content=BODY, headers=signed_request(NEW_SECRET, "msg_s", BODY, at)
        )
    assert response.status_code == 401
    assert word in response.json()["detail"]
    assert await db.fetchval("SELECT count(*) FROM inbox_messages") == 0


async def test_timestamp_inside_tolerance_is_accepted(client_for: AppFactory) -> None:
    at = datetime.now(tz=UTC) - timedelta(seconds=280)
    async with client_for(CONFIG) as client:
        response = await client.post(
            "/webhooks/sw", content=BODY, headers=signed_request(NEW_SECRET, "msg_ok", BODY, at)
        )
    assert response.status_code == 200


async def test_wrong_secret_is_401(client_for: AppFactory) -> None:
    other = "whsec_" + base64.b64encode(b"someone-else-entirely-000000000").decode()
    async with client_for(CONFIG) as client:
        response = await client.post(
            "/webhooks/sw", content=BODY, headers=signed_request(other, "msg_w", BODY)
        )
    assert response.status_code == 401


def test_our_signature_matches_the_library_and_the_library_verifies_ours() -> None:
    now = int(time.time())
    ours = sign(decode_secret(NEW_SECRET), "msg_x", now, BODY)
    theirs = Webhook(NEW_SECRET).sign("msg_x", datetime.fromtimestamp(now, tz=UTC), BODY.decode())
    assert ours == theirs
    headers = {"webhook-id": "msg_x", "webhook-timestamp": str(now), "webhook-signature": ours}
    assert Webhook(NEW_SECRET).verify(BODY, headers) == json.loads(BODY)


def test_standard_webhooks_spec_example_vector() -> None:
    # The worked example in the Standard Webhooks specification.
    secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    body = b'{"test": 2432232314}'
    expected = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
    assert sign(decode_secret(secret), "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body) == expected
