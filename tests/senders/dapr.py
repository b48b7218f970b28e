"""What a Dapr sidecar sends: its CloudEvents envelope, with the app API token."""

from __future__ import annotations

import json
from typing import Any

APP_TOKEN = "dapr-app-token-0123456789"
CONFIG: dict[str, Any] = {
    "sources": {
        "orders": {"kind": "dapr", "app_api_token": APP_TOKEN},
        "strict": {"kind": "dapr", "on_malformed": "reject"},
    }
}
HEADERS = {"content-type": "application/cloudevents+json", "dapr-api-token": APP_TOKEN}


def envelope(event_id: str = "5929aaac-a5e2-4ca1-859c-edfe73f11565", **changes: Any) -> bytes:
    """The shape of an envelope the sidecar posts (docs.dapr.io, pub/sub CloudEvents)."""
    body: dict[str, Any] = {
        "specversion": "1.0",
        "type": "com.dapr.event.sent",
        "source": "checkout",
        "id": event_id,
        "datacontenttype": "application/json",
        "data": {"orderId": 100},
        "topic": "orders",
        "pubsubname": "order-pub-sub",
        "traceid": "00-113ad9c4e42b27583ae98ba698d54255-e3743e35ff56f219-01",
        "traceparent": "00-113ad9c4e42b27583ae98ba698d54255-e3743e35ff56f219-01",
        "tracestate": "",
    }
    body.update(changes)
    return json.dumps({k: v for k, v in body.items() if v is not None}).encode()
