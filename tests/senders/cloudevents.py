"""What a CloudEvents sender sends, built by the official SDK; the sources that receive it."""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

from cloudevents.core.v1.event import CloudEvent

SECRET = "ce-test-secret-0123456789"
CONFIG: dict[str, Any] = {
    "sources": {
        "ce": {"kind": "cloudevents"},
        "ce-token": {"kind": "cloudevents", "token": "ce-token-0123456789"},
        "ce-hmac": {
            "kind": "cloudevents",
            "secrets": [SECRET],
            "hmac": {"header": "X-Signature", "prefix": "sha256="},
            "allowed_origins": ["eventgrid.azure.net"],
            "allowed_rate": "120",
        },
    }
}


def event(event_id: str = "A-1", source: str = "/orders", **extra: Any) -> CloudEvent:
    attributes = {
        "type": "com.example.order.created",
        "source": source,
        "id": event_id,
        "datacontenttype": "application/json",
        **extra,
    }
    return CloudEvent(attributes, {"order": event_id})


def sign(body: bytes, secret: str = SECRET) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
