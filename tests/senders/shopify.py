"""What Shopify sends: a base64 HMAC of the raw body, the webhook id and topic in headers."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from typing import Any

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
