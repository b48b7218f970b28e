"""The stripe kind against stripe-python's own signing helpers and a real database."""

from __future__ import annotations

import json
import time
from typing import Any

import asyncpg
import pytest
import stripe

from service.core.settings import ConfigError
from service.sources.config_file import parse_inbox_config
from service.sources.stripe import (
    parse_signature_header,
    stripe_signature,
    stripe_signature_header,
)
from tests.conftest import AppFactory
from tests.sources.helpers import assert_rejected, count_rows, only_row

SECRET = "whsec_test_secret"  # stripe-python's DUMMY_WEBHOOK_SECRET
OLD_SECRET = "whsec_rotated_out_0123456789"
# stripe-python's DUMMY_WEBHOOK_PAYLOAD (tests/test_webhook.py), byte for byte.
SDK_PAYLOAD = """{
  "id": "evt_test_webhook",
  "object": "event",
  "data": { "object": { "id": "rdr_123", "object": "terminal.reader" } }
}"""

CONFIG: dict[str, Any] = {
    "sources": {"payments": {"kind": "stripe", "secrets": [OLD_SECRET, SECRET]}}
}


def generate_header(
    payload: str,
    secret: str = SECRET,
    timestamp: int | None = None,
    scheme: str = "v1",
    signature: str | None = None,
) -> str:
    """As stripe-python's tests build a Stripe-Signature header, with the SDK's own HMAC."""
    timestamp = int(time.time()) if timestamp is None else timestamp
    if signature is None:
        signature = stripe.WebhookSignature._compute_signature(f"{timestamp}.{payload}", secret)
    return f"t={timestamp},{scheme}={signature}"


def event(event_id: str = "evt_1", event_type: str = "charge.succeeded") -> str:
    return json.dumps({"id": event_id, "object": "event", "type": event_type, "data": {}})


def headers(signature: str) -> dict[str, str]:
    return {"content-type": "application/json", "stripe-signature": signature}


# -- the signing function, against the SDK --------------------------------------------------


def test_signature_matches_stripe_python() -> None:
    ours = stripe_signature(SECRET.encode(), 1_700_000_000, SDK_PAYLOAD.encode())
    theirs = stripe.WebhookSignature._compute_signature(f"1700000000.{SDK_PAYLOAD}", SECRET)
    assert ours == theirs


def test_header_is_what_stripe_python_generates_and_verifies() -> None:
    header = stripe_signature_header(SECRET.encode(), 1_700_000_000, SDK_PAYLOAD.encode())
    assert header == stripe.WebhookSignature.generate_signature_header(
        SDK_PAYLOAD, SECRET, timestamp=1_700_000_000
    )
    assert stripe.WebhookSignature.verify_header(SDK_PAYLOAD, header, SECRET)


def test_header_parsing_keeps_every_v1_and_ignores_other_schemes() -> None:
    assert parse_signature_header("t=12,v1=aa,v0=bb,v1=cc") == (12, ["aa", "cc"])
    with pytest.raises(ValueError, match="no t= element"):
        parse_signature_header("v1=aa")
    with pytest.raises(ValueError, match="invalid literal"):
        parse_signature_header("t=soon,v1=aa")


def test_stripe_needs_a_secret() -> None:
    with pytest.raises(ConfigError, match="stripe needs at least one entry in secrets"):
        parse_inbox_config({"sources": {"p": {"kind": "stripe"}}})


# -- over HTTP, on a real database -----------------------------------------------------------


async def test_sdk_payload_signed_by_the_sdk_is_accepted(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    header = stripe.WebhookSignature.generate_signature_header(SDK_PAYLOAD, SECRET)
    async with client_for(CONFIG) as client:
        response = await client.post(
            "/webhooks/payments", content=SDK_PAYLOAD.encode(), headers=headers(header)
        )
    assert response.status_code == 200
    assert response.json()["status"] == "accepted"
    assert response.json()["message_id"] == "evt_test_webhook"
    row = await only_row(db)
    assert bytes(row["body"]) == SDK_PAYLOAD.encode()
    assert row["event_type"] is None  # that payload has no type
    assert row["headers"]["stripe-signature"] == "[redacted]"


async def test_event_is_recorded_with_its_type_and_redelivery_is_a_duplicate(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    body = event("evt_dup", "invoice.paid")
    first_header = generate_header(body)
    async with client_for(CONFIG) as client:
        first = await client.post("/webhooks/payments", content=body, headers=headers(first_header))
        # Stripe signs each attempt afresh: a retry has a new t= and signature, same event id.
        retry_header = generate_header(body, timestamp=int(time.time()) + 1)
        again = await client.post("/webhooks/payments", content=body, headers=headers(retry_header))
    assert first.json()["status"] == "accepted"
    assert again.status_code == 200
    assert again.json() == {"status": "duplicate", "message_id": "evt_dup"}
    row = await only_row(db)
    assert row["event_type"] == "invoice.paid"
    assert row["receive_count"] == 2


async def test_rotated_secret_and_extra_signatures(client_for: AppFactory) -> None:
    body_old, body_new = event("evt_old"), event("evt_new")
    # During rotation Stripe signs with both secrets: one header, two v1 entries.
    both = (
        generate_header(body_new)
        + ",v1="
        + stripe_signature(OLD_SECRET.encode(), int(time.time()), body_new.encode())
    )
    async with client_for(CONFIG) as client:
        old = await client.post(
            "/webhooks/payments",
            content=body_old,
            headers=headers(generate_header(body_old, secret=OLD_SECRET)),
        )
        new = await client.post("/webhooks/payments", content=body_new, headers=headers(both))
    assert old.json()["status"] == "accepted"
    assert new.json()["status"] == "accepted"


def _tampered_body() -> tuple[str, str]:
    return event("evt_x").replace("charge", "chargf"), generate_header(event("evt_x"))


def _tampered_signature() -> tuple[str, str]:
    body = event("evt_x")
    header = generate_header(body)
    return body, header[:-1] + ("0" if header[-1] != "0" else "1")


REJECTIONS = {
    "tampered body": (_tampered_body, 401, "no Stripe-Signature v1 signature matches"),
    "tampered signature": (_tampered_signature, 401, "no Stripe-Signature v1 signature matches"),
    "wrong secret": (
        lambda: (event(), generate_header(event(), secret="whsec_someone_else")),
        401,
        "matches a configured secret",
    ),
    "stale timestamp": (
        lambda: (event(), generate_header(event(), timestamp=int(time.time()) - 301)),
        401,
        "too old",
    ),
    "future timestamp": (
        lambda: (event(), generate_header(event(), timestamp=int(time.time()) + 360)),
        401,
        "in the future",
    ),
    "only a v0 signature": (
        lambda: (event(), generate_header(event(), scheme="v0")),
        401,
        "has no v1 signature",
    ),
    "malformed header": (lambda: (event(), "i'm not a signature header"), 401, "malformed"),
    "missing event id": (
        lambda: (json.dumps({"type": "t"}), generate_header(json.dumps({"type": "t"}))),
        400,
        "JSON field id",
    ),
    "malformed JSON": (lambda: ('{"id": ', generate_header('{"id": ')), 400, "not valid JSON"),
}


@pytest.mark.parametrize("case", list(REJECTIONS))
async def test_rejections_record_nothing(
    client_for: AppFactory, db: asyncpg.Connection, case: str
) -> None:
    build, status, detail = REJECTIONS[case]
    body, header = build()
    async with client_for(CONFIG) as client:
        response = await client.post("/webhooks/payments", content=body, headers=headers(header))
    await assert_rejected(response, db, status, detail)


async def test_missing_signature_header_is_401_naming_it(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    async with client_for(CONFIG) as client:
        response = await client.post(
            "/webhooks/payments", content=event(), headers={"content-type": "application/json"}
        )
    await assert_rejected(response, db, 401, "missing Stripe-Signature header")


async def test_signed_non_json_is_415(client_for: AppFactory, db: asyncpg.Connection) -> None:
    body = event()
    async with client_for(CONFIG) as client:
        response = await client.post(
            "/webhooks/payments",
            content=body,
            headers={"content-type": "text/plain", "stripe-signature": generate_header(body)},
        )
    await assert_rejected(response, db, 415, "text/plain")


async def test_tolerance_is_configurable(client_for: AppFactory, db: asyncpg.Connection) -> None:
    config = {"sources": {"p": {"kind": "stripe", "secrets": [SECRET], "tolerance_seconds": 900}}}
    body = event("evt_late")
    async with client_for(config) as client:
        response = await client.post(
            "/webhooks/p",
            content=body,
            headers=headers(generate_header(body, timestamp=int(time.time()) - 600)),
        )
    assert response.json()["status"] == "accepted"
    assert await count_rows(db) == 1
