"""What Stripe sends, signed by stripe-python's own helpers."""

from __future__ import annotations

import json
import time
from typing import Any

import stripe

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
