"""Shopify: base64 HMAC-SHA256 of the body in `X-Shopify-Hmac-Sha256`, keyed by webhook id."""

from __future__ import annotations

import base64
import binascii
import json

from service.sources.base import (
    HeaderName,
    Message,
    Messages,
    RawDelivery,
    Unauthenticated,
    first_header,
)
from service.sources.limits import checked_event_type, checked_message_id
from service.sources.signing import SignedSource, hmac_sha256, require_mac_match

SIGNATURE_HEADER = HeaderName("X-Shopify-Hmac-Sha256")
ID_HEADER = HeaderName("X-Shopify-Webhook-Id")
TOPIC_HEADER = HeaderName("X-Shopify-Topic")


def shopify_signature(secret: bytes, body: bytes) -> str:
    """The `X-Shopify-Hmac-Sha256` value: base64 HMAC-SHA256 of the raw body."""
    return base64.b64encode(hmac_sha256(secret, body)).decode()


class ShopifySource(SignedSource):
    kind = "shopify"
    sensitive_headers = frozenset({"x-shopify-hmac-sha256"})
    # Since 2024-09 Shopify retries "8 times over 4 hours" (shopify.dev changelog "Updates to
    # webhook retry mechanism"); a day leaves room for a delivery that is itself slow to arrive.
    redelivery_days = 1.0

    async def verify(self, delivery: RawDelivery) -> Messages:
        raw = delivery.raw_headers
        header = SIGNATURE_HEADER.required(raw)
        try:
            offered = base64.b64decode(header.strip(), validate=True)
        except (binascii.Error, ValueError):
            raise Unauthenticated(f"{SIGNATURE_HEADER.name} is not base64") from None
        require_mac_match(
            self.macs,
            delivery.body,
            [offered],
            f"{SIGNATURE_HEADER.name} does not match a configured secret",
        )

        # Everything needed is in headers, so the body stays opaque: Shopify may send JSON or,
        # for webhooks created in the admin with that format, XML.
        message_id = checked_message_id(first_header(raw, ID_HEADER.raw), ID_HEADER.where)
        topic = checked_event_type(first_header(raw, TOPIC_HEADER.raw), TOPIC_HEADER.where)
        return Messages([Message(message_id, topic)])

    def example_curl(self, base_url: str) -> str | None:
        body = json.dumps({"id": 820982911946154508, "email": "jon@example.com"})
        signature = shopify_signature(self.config.secret_values()[0], body.encode())
        headers = {
            TOPIC_HEADER.name: "orders/create",
            ID_HEADER.name: "demo-webhook-1",
            SIGNATURE_HEADER.name: signature,
        }
        return self.curl_json(base_url, headers, body)
