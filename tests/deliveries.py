"""A delivery of every kind, authentic, carrying the message id and event type a test chooses.

For tests of what a sender may put in the values that are stored: each kind takes its event
type from a different place (a header, a body field, an attribute, a percent-encoded header).
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import httpx
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from service.sources.config_file import InboxConfig, parse_inbox_config
from service.sources.github import github_signature
from service.sources.shopify import shopify_signature
from service.sources.slack import slack_signature
from service.sources.sns import SnsSource, string_to_sign
from service.sources.standard_webhooks import decode_secret, sign
from service.sources.stripe import stripe_signature_header
from tests.senders.sns import self_signed

SECRET = "whsec_" + base64.b64encode(b"deliveries-of-every-kind-key-32b").decode()
KEY = SECRET.encode()
TOKEN = "a-long-shared-token-value"
SNS_CERT_URL = "https://sns.us-east-1.amazonaws.com/SimpleNotificationService-test.pem"
SNS_TOPIC = "arn:aws:sns:us-east-1:123456789012:orders"

SOURCES: dict[str, dict[str, Any]] = {
    "generic-header": {
        "kind": "generic",
        "id_header": "x-id",
        "event_type_header": "x-event-type",
        "token": TOKEN,
    },
    "generic-json": {
        "kind": "generic",
        "id_json_pointer": "/id",
        "event_type_json_pointer": "/type",
        "token": TOKEN,
    },
    "standard-webhooks": {"kind": "standard-webhooks", "secrets": [SECRET]},
    "stripe": {"kind": "stripe", "secrets": [SECRET]},
    "github": {"kind": "github", "secrets": [SECRET]},
    "shopify": {"kind": "shopify", "secrets": [SECRET]},
    "slack": {"kind": "slack", "secrets": [SECRET]},
    "pubsub": {"kind": "pubsub", "token": TOKEN, "event_type_attribute": "type"},
    "sns": {"kind": "sns", "topic_arns": [SNS_TOPIC]},
    "eventgrid": {"kind": "eventgrid", "token": TOKEN},
    "cloudevents-binary": {"kind": "cloudevents", "token": TOKEN},
    "cloudevents-structured": {"kind": "cloudevents", "token": TOKEN},
    "dapr": {"kind": "dapr", "app_api_token": TOKEN},
}

# Where each source reads its event type from: a header carries only Latin-1 text.
FROM_HEADER = {"generic-header", "github", "shopify"}


@dataclass
class Delivery:
    path: str
    body: bytes
    headers: dict[str, bytes] = field(default_factory=dict)


def _json(value: Any) -> bytes:
    # ensure_ascii: an unpaired surrogate travels as a JSON escape, as a hostile sender's would.
    return json.dumps(value).encode()


def _generic_header(msg_id: str, event_type: str) -> Delivery:
    headers = {"x-id": msg_id.encode(), "x-event-type": event_type.encode("latin-1")}
    return Delivery(f"/webhooks/generic-header?token={TOKEN}", b"{}", headers)


def _generic_json(msg_id: str, event_type: str) -> Delivery:
    body = _json({"id": msg_id, "type": event_type})
    return Delivery(f"/webhooks/generic-json?token={TOKEN}", body)


def _standard(msg_id: str, event_type: str) -> Delivery:
    body = _json({"type": event_type})
    now = int(time.time())
    headers = {
        "webhook-id": msg_id.encode(),
        "webhook-timestamp": str(now).encode(),
        "webhook-signature": sign(decode_secret(SECRET), msg_id, now, body).encode(),
    }
    return Delivery("/webhooks/standard-webhooks", body, headers)


def _stripe(msg_id: str, event_type: str) -> Delivery:
    body = _json({"id": msg_id, "object": "event", "type": event_type})
    header = stripe_signature_header(KEY, int(time.time()), body)
    return Delivery("/webhooks/stripe", body, {"stripe-signature": header.encode()})


def _signed_body_named_in_headers(
    kind: str,
    signature: Callable[[bytes, bytes], str],
    signature_header: str,
    id_header: str,
    event_type_header: str,
) -> Callable[[str, str], Delivery]:
    """The builder of a kind that signs the body alone and names the message id and the event
    type in headers of their own (github, shopify)."""

    def build(msg_id: str, event_type: str) -> Delivery:
        body = b"{}"
        headers = {
            signature_header: signature(KEY, body).encode(),
            id_header: msg_id.encode(),
            event_type_header: event_type.encode("latin-1"),
        }
        return Delivery(f"/webhooks/{kind}", body, headers)

    return build


_github = _signed_body_named_in_headers(
    "github", github_signature, "x-hub-signature-256", "x-github-delivery", "x-github-event"
)
_shopify = _signed_body_named_in_headers(
    "shopify", shopify_signature, "x-shopify-hmac-sha256", "x-shopify-webhook-id", "x-shopify-topic"
)


def _slack(msg_id: str, event_type: str) -> Delivery:
    body = _json({"type": "event_callback", "event_id": msg_id, "event": {"type": event_type}})
    ts = str(int(time.time()))
    headers = {
        "x-slack-request-timestamp": ts.encode(),
        "x-slack-signature": slack_signature(KEY, ts, body).encode(),
    }
    return Delivery("/webhooks/slack", body, headers)


def _pubsub(msg_id: str, event_type: str) -> Delivery:
    body = _json({"message": {"messageId": msg_id, "attributes": {"type": event_type}}})
    return Delivery(f"/webhooks/pubsub?token={TOKEN}", body)


def _eventgrid(msg_id: str, event_type: str) -> Delivery:
    event = {"id": msg_id, "eventType": event_type, "subject": "s", "data": {}}
    return Delivery(f"/webhooks/eventgrid?token={TOKEN}", _json([event]))


def _cloudevent(msg_id: str, event_type: str) -> dict[str, str]:
    return {"specversion": "1.0", "id": msg_id, "source": "/tests", "type": event_type}


def _cloudevents_binary(msg_id: str, event_type: str) -> Delivery:
    # The HTTP binding percent-encodes attribute values: any text, NUL included, can arrive.
    headers = {
        "ce-specversion": b"1.0",
        "ce-id": quote(msg_id, safe="").encode(),
        "ce-source": b"/tests",
        "ce-type": quote(event_type, safe="", errors="surrogatepass").encode(),
    }
    return Delivery(f"/webhooks/cloudevents-binary?token={TOKEN}", b"{}", headers)


def _cloudevents_structured(msg_id: str, event_type: str) -> Delivery:
    body = _json(_cloudevent(msg_id, event_type))
    headers = {"content-type": b"application/cloudevents+json"}
    return Delivery(f"/webhooks/cloudevents-structured?token={TOKEN}", body, headers)


def _dapr(msg_id: str, event_type: str) -> Delivery:
    body = _json(_cloudevent(msg_id, event_type))
    headers = {"content-type": b"application/cloudevents+json", "dapr-api-token": TOKEN.encode()}
    return Delivery("/webhooks/dapr", body, headers)


class SnsSigner:
    """Signs SNS notifications with a local key, whose certificate the source is handed."""

    def __init__(self) -> None:
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.pem = self_signed(self.key)

    async def certificate_pem(self, url: str) -> bytes:
        return self.pem

    async def confirm_subscription(self, url: str) -> None:
        raise AssertionError("no subscription is confirmed here")

    def __call__(self, msg_id: str, event_type: str) -> Delivery:
        message = {
            "Type": "Notification",
            "MessageId": msg_id,
            "TopicArn": SNS_TOPIC,
            "Subject": event_type,
            "Message": "hello",
            "Timestamp": "2024-01-01T00:00:00.000Z",
            "SignatureVersion": "2",
            "SigningCertURL": SNS_CERT_URL,
        }
        # Signed as the service will read it, once JSON has paired adjacent surrogates up.
        message = json.loads(json.dumps(message))
        signature = self.key.sign(string_to_sign(message), padding.PKCS1v15(), hashes.SHA256())
        message["Signature"] = base64.b64encode(signature).decode()
        return Delivery("/webhooks/sns", _json(message), {"content-type": b"text/plain"})


SNS = SnsSigner()

BUILDERS: dict[str, Callable[[str, str], Delivery]] = {
    "generic-header": _generic_header,
    "generic-json": _generic_json,
    "standard-webhooks": _standard,
    "stripe": _stripe,
    "github": _github,
    "shopify": _shopify,
    "slack": _slack,
    "pubsub": _pubsub,
    "sns": SNS,
    "eventgrid": _eventgrid,
    "cloudevents-binary": _cloudevents_binary,
    "cloudevents-structured": _cloudevents_structured,
    "dapr": _dapr,
}
KINDS = sorted(BUILDERS)


def delivery(kind: str, msg_id: str, event_type: str) -> Delivery:
    """An authentic delivery to the source `kind` of `SOURCES`."""
    built = BUILDERS[kind](msg_id, event_type)
    built.headers.setdefault("content-type", b"application/json")
    return built


def inbox() -> InboxConfig:
    """`SOURCES` built, the SNS source fetching its certificate from `SNS`."""
    config = parse_inbox_config({"sources": SOURCES})
    sns = config.sources["sns"]
    assert isinstance(sns, SnsSource)
    sns.fetcher = SNS
    return config


def stored_message_id(kind: str, msg_id: str) -> str:
    """The dedup key a kind stores for `msg_id`: CloudEvents kinds pair it with the source."""
    if kind.startswith("cloudevents") or kind == "dapr":
        return json.dumps(["/tests", msg_id], separators=(",", ":"))
    return msg_id


def refusal(kind: str, response: httpx.Response) -> str | None:
    """The detail of a refused delivery (a 4xx problem, or Dapr's 200 DROP: its default
    `on_malformed`), or None for a delivery that was recorded."""
    if response.status_code == 200:
        answer = response.json()
        return str(answer["detail"]) if answer.get("status") == "DROP" else None
    assert response.headers["content-type"] == "application/problem+json", response.text
    return str(response.json()["detail"])
