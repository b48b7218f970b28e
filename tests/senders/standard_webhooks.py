"""What a Standard Webhooks sender sends, signed by the `standardwebhooks` library itself."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime

from standardwebhooks.webhooks import Webhook

OLD_SECRET = "whsec_" + base64.b64encode(b"old-key-material-0123456789abcdef").decode()
NEW_SECRET = "whsec_" + base64.b64encode(b"new-key-material-0123456789abcdef").decode()
CONFIG = {"sources": {"sw": {"kind": "standard-webhooks", "secrets": [NEW_SECRET, OLD_SECRET]}}}

BODY = json.dumps({"type": "invoice.paid", "data": {"amount": 42}}).encode()


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
