"""Stripe: `Stripe-Signature: t=…,v1=…`, hex HMAC-SHA256 of `t.body`; the event `id` is the key."""

from __future__ import annotations

import json

from service.sources.base import (
    HeaderName,
    Message,
    Messages,
    RawDelivery,
    Unauthenticated,
    parse_json,
    require_json_media_type,
)
from service.sources.limits import checked_event_type, checked_message_id
from service.sources.signing import (
    SignedSource,
    check_timestamp,
    hmac_sha256,
    now,
    require_match,
)

HEADER = HeaderName("Stripe-Signature")
# Only v1 is Stripe's live scheme; v0 (and any future scheme) is ignored, as stripe-python does.
SCHEME = "v1"


def stripe_signature(secret: bytes, timestamp: int, body: bytes) -> str:
    """The `v1` value: hex HMAC-SHA256 of `"{t}.{body}"`, keyed by the whole `whsec_…` string."""
    return hmac_sha256(secret, _signed(timestamp, body)).hex()


def _signed(timestamp: int, body: bytes) -> bytes:
    return f"{timestamp}.".encode() + body


def stripe_signature_header(secret: bytes, timestamp: int, body: bytes) -> str:
    return f"t={timestamp},{SCHEME}={stripe_signature(secret, timestamp, body)}"


def parse_signature_header(header: str) -> tuple[int, list[str]]:
    """`t` and every `v1` value of a `Stripe-Signature` header; ValueError when it has no `t`."""
    timestamps: list[str] = []
    signatures: list[str] = []
    for item in header.split(","):
        key, _, value = item.strip().partition("=")
        if key == "t":
            timestamps.append(value)
        elif key == SCHEME:
            signatures.append(value)
    if not timestamps:
        raise ValueError("no t= element")
    return int(timestamps[0]), signatures


class StripeSource(SignedSource):
    kind = "stripe"
    sensitive_headers = frozenset({"stripe-signature"})
    # "Stripe attempts to deliver events to your destination for up to three days with an
    # exponential back off" (docs.stripe.com/webhooks, live mode).
    redelivery_days = 3.0

    async def verify(self, delivery: RawDelivery) -> Messages:
        header = HEADER.required(delivery.raw_headers)
        try:
            timestamp, offered = parse_signature_header(header)
        except ValueError:
            raise Unauthenticated(f"{HEADER.name} is malformed: expected t=…,v1=…") from None
        if not offered:
            raise Unauthenticated(f"{HEADER.name} has no {SCHEME} signature")
        signed = _signed(timestamp, delivery.body)
        expected = [mac.digest(signed).hex() for mac in self.macs]
        require_match(
            expected, offered, f"no {HEADER.name} {SCHEME} signature matches a configured secret"
        )
        check_timestamp(str(timestamp), f"{HEADER.name} timestamp", self.tolerance_seconds)

        require_json_media_type(delivery)
        payload = parse_json(delivery.body)
        if not isinstance(payload, dict):
            payload = {}
        message_id = checked_message_id(payload.get("id"), "the JSON field id (the event id)")
        event_type = checked_event_type(payload.get("type"), "the JSON field type")
        return Messages([Message(message_id, event_type)])

    def example_curl(self, base_url: str) -> str | None:
        body = json.dumps({"id": "evt_demo_1", "object": "event", "type": "demo.created"})
        header = stripe_signature_header(self.config.secret_values()[0], int(now()), body.encode())
        return self.curl_json(base_url, {HEADER.name: header}, body)
