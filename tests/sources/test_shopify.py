"""The shopify kind: base64 HMAC of the raw body, webhook id and topic from headers."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from typing import Any

import asyncpg
import pytest

from service.core.settings import ConfigError
from service.sources.config_file import parse_inbox_config
from service.sources.shopify import shopify_signature
from tests.conftest import AppFactory
from tests.sources.helpers import assert_rejected, only_row

SECRET = "shpss_0123456789abcdef0123456789abcdef"
OLD_SECRET = "shpss_rotated_out_0123456789abcdef"
CONFIG: dict[str, Any] = {"sources": {"shop": {"kind": "shopify", "secrets": [OLD_SECRET, SECRET]}}}

ORDER = {"id": 820982911946154508, "email": "jon@example.com", "total_price": "123.45"}


def signed(
    payload: dict[str, Any] | bytes,
    webhook_id: str | None = "b54557e4-bdd9-4b37-8a5f-bf7d70bcd043",
    secret: str = SECRET,
    topic: str = "orders/create",
) -> tuple[bytes, dict[str, str]]:
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    # Written out as Shopify's docs do it, independently of the code under test.
    digest = hmac.new(secret.encode("utf-8"), body, hashlib.sha256).digest()
    headers = {
        "content-type": "application/json",
        "x-shopify-topic": topic,
        "x-shopify-hmac-sha256": base64.b64encode(digest).decode(),
        "x-shopify-shop-domain": "example.myshopify.com",
        "x-shopify-api-version": "2025-01",
        "x-shopify-event-id": "98880550-7158-44d4-b7cd-2c97c8a091b5",
    }
    if webhook_id is not None:
        headers["x-shopify-webhook-id"] = webhook_id
    return body, headers


def test_signature_is_base64_hmac_sha256_of_the_body() -> None:
    body, headers = signed(ORDER)
    assert shopify_signature(SECRET.encode(), body) == headers["x-shopify-hmac-sha256"]
    assert len(base64.b64decode(shopify_signature(b"k", b""))) == 32


def test_shopify_needs_a_secret() -> None:
    with pytest.raises(ConfigError, match="shopify needs at least one entry in secrets"):
        parse_inbox_config({"sources": {"s": {"kind": "shopify"}}})


async def test_order_is_recorded_and_a_retry_is_a_duplicate(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    body, headers = signed(ORDER)
    async with client_for(CONFIG) as client:
        first = await client.post("/webhooks/shop", content=body, headers=headers)
        again = await client.post("/webhooks/shop", content=body, headers=headers)
    assert first.status_code == 200
    assert first.json()["status"] == "accepted"
    assert first.json()["message_id"] == "b54557e4-bdd9-4b37-8a5f-bf7d70bcd043"
    assert again.status_code == 200
    assert again.json()["status"] == "duplicate"
    row = await only_row(db)
    assert row["event_type"] == "orders/create"
    assert row["receive_count"] == 2
    assert row["headers"]["x-shopify-hmac-sha256"] == "[redacted]"


async def test_xml_format_webhook_is_accepted_untouched(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    body, headers = signed(b"<?xml version='1.0'?><order><id>1</id></order>")
    headers["content-type"] = "application/xml"
    async with client_for(CONFIG) as client:
        response = await client.post("/webhooks/shop", content=body, headers=headers)
    assert response.json()["status"] == "accepted"
    assert bytes((await only_row(db))["body"]) == body


async def test_rotated_secret_verifies(client_for: AppFactory) -> None:
    body, headers = signed(ORDER, secret=OLD_SECRET)
    async with client_for(CONFIG) as client:
        response = await client.post("/webhooks/shop", content=body, headers=headers)
    assert response.json()["status"] == "accepted"


def _tampered_body() -> tuple[bytes, dict[str, str]]:
    body, headers = signed(ORDER)
    return body.replace(b"123.45", b"0.01"), headers


def _tampered_signature() -> tuple[bytes, dict[str, str]]:
    body, headers = signed(ORDER)
    digest = bytearray(base64.b64decode(headers["x-shopify-hmac-sha256"]))
    digest[0] ^= 1
    headers["x-shopify-hmac-sha256"] = base64.b64encode(bytes(digest)).decode()
    return body, headers


def _with(name: str, value: str | None) -> tuple[bytes, dict[str, str]]:
    body, headers = signed(ORDER)
    if value is None:
        del headers[name]
    else:
        headers[name] = value
    return body, headers


REJECTIONS = {
    "tampered body": (_tampered_body, 401, "X-Shopify-Hmac-Sha256 does not match"),
    "tampered signature": (_tampered_signature, 401, "X-Shopify-Hmac-Sha256 does not match"),
    "wrong secret": (
        lambda: signed(ORDER, secret="shpss_someone_else"),
        401,
        "does not match a configured secret",
    ),
    "hex instead of base64": (
        lambda: _with("x-shopify-hmac-sha256", "ab" * 32),
        401,
        "does not match a configured secret",
    ),
    "not base64 at all": (lambda: _with("x-shopify-hmac-sha256", "sha256=ab!"), 401, "not base64"),
    "missing signature header": (
        lambda: _with("x-shopify-hmac-sha256", None),
        401,
        "missing X-Shopify-Hmac-Sha256 header",
    ),
    "missing webhook id": (lambda: signed(ORDER, webhook_id=None), 400, "X-Shopify-Webhook-Id"),
}


@pytest.mark.parametrize("case", list(REJECTIONS))
async def test_rejections_record_nothing(
    client_for: AppFactory, db: asyncpg.Connection, case: str
) -> None:
    build, status, detail = REJECTIONS[case]
    body, headers = build()
    async with client_for(CONFIG) as client:
        response = await client.post("/webhooks/shop", content=body, headers=headers)
    await assert_rejected(response, db, status, detail)
