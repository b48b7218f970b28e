"""Test deliveries: for a configured source, the request its kind accepts, signed with its secret.

Each kind's builder uses the kind's own signing function from `service.sources`, so a delivery
built here is verified by exactly the code that verifies a provider's. Kinds whose credentials
only the provider can make (SNS's certificate signatures, Pub/Sub's Google-signed OIDC tokens)
are refused with a reason.
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from service.sources.base import AnySource
from service.sources.body_hmac import HmacConfig, body_signature
from service.sources.cloudevents_http import STRUCTURED, dedup_key
from service.sources.github import DELIVERY_HEADER, EVENT_HEADER, github_signature
from service.sources.shopify import ID_HEADER, TOPIC_HEADER, shopify_signature
from service.sources.signing import now
from service.sources.slack import SIGNATURE_HEADER as SLACK_SIGNATURE
from service.sources.slack import TIMESTAMP_HEADER as SLACK_TIMESTAMP
from service.sources.slack import slack_signature
from service.sources.standard_webhooks import StandardWebhooksSource
from service.sources.standard_webhooks import sign as standard_webhooks_signature
from service.sources.stripe import HEADER as STRIPE_HEADER
from service.sources.stripe import stripe_signature_header

# The CloudEvents `source` of what `send` builds: fixed, so the same --id is the same message.
CLOUDEVENTS_SOURCE = "urn:webhook-inbox:send"
JSON = "application/json"


class CannotBuild(Exception):
    """This source's deliveries cannot be made here (or not with the options given): why."""


@dataclass(frozen=True)
class Wanted:
    """What the caller asked for; None where the kind's default (or the file's value) applies."""

    payload: Any = None  # the --file's JSON
    raw: bytes | None = None  # the --file's bytes, sent unchanged when nothing is set in them
    message_id: str | None = None
    event_type: str | None = None


@dataclass
class Delivery:
    """The request to send: body, headers, query, and the message id the service should name."""

    body: bytes
    message_id: str
    headers: dict[str, str] = field(default_factory=dict)
    query: dict[str, str] = field(default_factory=dict)


def new_id(prefix: str = "evt_") -> str:
    return prefix + secrets.token_hex(8)


def timestamp() -> int:
    return int(now())


def iso_now() -> str:
    return datetime.fromtimestamp(now(), UTC).isoformat().replace("+00:00", "Z")


def encode(document: Any) -> bytes:
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode()


def json_object(wanted: Wanted, default: dict[str, Any], what: str) -> dict[str, Any]:
    """The file's JSON object (or `default`), copied so that fields can be set in it."""
    if wanted.payload is None:
        return dict(default)
    if not isinstance(wanted.payload, dict):
        raise CannotBuild(f"--file must hold a JSON object: {what}")
    return dict(wanted.payload)


def body_of(wanted: Wanted, document: dict[str, Any]) -> bytes:
    """The file's own bytes when nothing was set in them, else `document` written as JSON."""
    if wanted.raw is not None and document == wanted.payload:
        return wanted.raw
    return encode(document)


def set_pointer(document: dict[str, Any], pointer: str, value: str) -> None:
    """Put `value` at an RFC 6901 `pointer` of `document`, making the objects on the way."""
    tokens = [t.replace("~1", "/").replace("~0", "~") for t in pointer[1:].split("/")]
    if not pointer:
        raise CannotBuild("the JSON pointer is the whole body; a value cannot be set there")
    current = document
    for token in tokens[:-1]:
        child = current.get(token)
        if child is None:
            child = current[token] = {}
        if not isinstance(child, dict):
            raise CannotBuild(f"cannot set {pointer}: {token!r} in the body is not an object")
        current = child
    current[tokens[-1]] = value


def get_pointer(document: dict[str, Any], pointer: str) -> Any:
    current: Any = document
    for token in pointer[1:].split("/"):
        token = token.replace("~1", "/").replace("~0", "~")
        current = current.get(token) if isinstance(current, dict) else None
    return current


def token_query(source: AnySource) -> dict[str, str]:
    """The shared `token` any kind may require, as the query parameter every kind reads."""
    token = source.config.token
    return {} if token is None else {"token": token.get_secret_value()}


def signed_hmac(spec: HmacConfig | None, source: AnySource, body: bytes) -> dict[str, str]:
    if spec is None:
        return {}
    key = source.config.secret_values()[0]
    return {spec.header: spec.prefix + body_signature(key, body, spec)}


def generic(source: AnySource, wanted: Wanted) -> Delivery:
    config = source.config
    document = json_object(
        wanted, {"type": "test.event", "data": {"sent_by": "webhook-inbox send"}}, "the body"
    )
    headers = {"content-type": JSON}
    message_id = wanted.message_id
    if config.id_header:
        message_id = message_id or new_id()
        headers[config.id_header] = message_id
    elif config.id_json_pointer is not None:
        if message_id is None and get_pointer(document, config.id_json_pointer) in (None, ""):
            message_id = new_id()
        if message_id is not None:
            set_pointer(document, config.id_json_pointer, message_id)
        message_id = str(get_pointer(document, config.id_json_pointer))
    elif message_id is not None:
        raise CannotBuild(
            f"source {source.name!r} names its messages by the body's SHA-256 "
            "(id_fallback); --id cannot choose it: change the body instead"
        )
    else:
        document.setdefault("nonce", secrets.token_hex(8))  # a new message each time
    if config.event_type_header:
        headers[config.event_type_header] = wanted.event_type or "test.event"
    elif config.event_type_json_pointer is not None:
        if wanted.event_type is not None:
            set_pointer(document, config.event_type_json_pointer, wanted.event_type)
    elif wanted.event_type is not None:
        raise CannotBuild(
            f"source {source.name!r} reads no event type (no event_type_header or "
            "event_type_json_pointer); drop --event-type"
        )
    body = body_of(wanted, document)
    if message_id is None:
        message_id = "sha256:" + hashlib.sha256(body).hexdigest()
    if config.basic_auth is not None:
        credentials = base64.b64encode(config.basic_auth.get_secret_value().encode()).decode()
        headers["authorization"] = f"Basic {credentials}"
    headers |= signed_hmac(config.hmac, source, body)
    return Delivery(body, message_id, headers, token_query(source))


def standard_webhooks(source: AnySource, wanted: Wanted) -> Delivery:
    document = json_object(
        wanted, {"type": "test.event", "timestamp": iso_now(), "data": {}}, "the event"
    )
    if wanted.event_type is not None:
        document["type"] = wanted.event_type
    body = body_of(wanted, document)
    message_id = wanted.message_id or new_id("msg_")
    sent_at = timestamp()
    assert isinstance(source, StandardWebhooksSource)
    if not source.keys:
        raise CannotBuild(
            f"source {source.name!r} has only public keys (v1a, ed25519); signing needs the "
            "sender's private key: add a whsec_ secret to send v1 signatures"
        )
    key = source.keys[0]
    headers = {
        "content-type": JSON,
        "webhook-id": message_id,
        "webhook-timestamp": str(sent_at),
        "webhook-signature": standard_webhooks_signature(key, message_id, sent_at, body),
    }
    return Delivery(body, message_id, headers, token_query(source))


def stripe(source: AnySource, wanted: Wanted) -> Delivery:
    document = json_object(
        wanted,
        {"object": "event", "created": timestamp(), "data": {"object": {"object": "charge"}}},
        "a Stripe event",
    )
    if wanted.message_id is not None or not document.get("id"):
        document["id"] = wanted.message_id or new_id()
    if wanted.event_type is not None or not document.get("type"):
        document["type"] = wanted.event_type or "charge.succeeded"
    body = body_of(wanted, document)
    secret = source.config.secret_values()[0]
    headers = {
        "content-type": JSON,
        STRIPE_HEADER.name: stripe_signature_header(secret, timestamp(), body),
    }
    return Delivery(body, str(document["id"]), headers, token_query(source))


def github(source: AnySource, wanted: Wanted) -> Delivery:
    # An event type `issues.opened` is GitHub's event `issues` with the body's action `opened`.
    event, _, action = (wanted.event_type or "ping").partition(".")
    document = json_object(wanted, {"zen": "Design for failure.", "hook_id": 0}, "the event")
    if action:
        document["action"] = action
    body = body_of(wanted, document)
    message_id = wanted.message_id or str(uuid.uuid4())
    headers = {
        "content-type": JSON,
        EVENT_HEADER.name: event,
        DELIVERY_HEADER.name: message_id,
        "X-Hub-Signature-256": github_signature(source.config.secret_values()[0], body),
    }
    return Delivery(body, message_id, headers, token_query(source))


def shopify(source: AnySource, wanted: Wanted) -> Delivery:
    document = json_object(wanted, {"id": 1, "note": "sent by webhook-inbox send"}, "the body")
    body = body_of(wanted, document)
    message_id = wanted.message_id or str(uuid.uuid4())
    headers = {
        "content-type": JSON,
        TOPIC_HEADER.name: wanted.event_type or "orders/create",
        ID_HEADER.name: message_id,
        "X-Shopify-Hmac-Sha256": shopify_signature(source.config.secret_values()[0], body),
    }
    return Delivery(body, message_id, headers, token_query(source))


def slack(source: AnySource, wanted: Wanted) -> Delivery:
    sent_at = str(timestamp())
    document = json_object(
        wanted,
        {"type": "event_callback", "event_time": int(sent_at), "event": {"type": "app_mention"}},
        "an Events API callback",
    )
    if wanted.message_id is not None or not document.get("event_id"):
        document["event_id"] = wanted.message_id or new_id("Ev")
    if wanted.event_type is not None:
        event = document.get("event")
        document["event"] = {
            **(event if isinstance(event, dict) else {}),
            "type": wanted.event_type,
        }
    body = body_of(wanted, document)
    headers = {
        "content-type": JSON,
        SLACK_TIMESTAMP.name: sent_at,
        SLACK_SIGNATURE.name: slack_signature(source.config.secret_values()[0], sent_at, body),
    }
    return Delivery(body, str(document["event_id"]), headers, token_query(source))


def pubsub(source: AnySource, wanted: Wanted) -> Delivery:
    config = source.config
    if config.audience is not None:
        raise CannotBuild(
            f"source {source.name!r} checks OIDC tokens that only Google can sign (audience is "
            "set); for a local test source, configure `token` instead (send puts it in the URL)"
        )
    message_id = wanted.message_id or str(secrets.randbelow(10**16))
    attributes = {}
    if config.event_type_attribute:
        attributes[config.event_type_attribute] = wanted.event_type or "test.event"
    elif wanted.event_type is not None:
        raise CannotBuild(
            f"source {source.name!r} reads no event type (no event_type_attribute); "
            "drop --event-type"
        )
    data = wanted.raw if wanted.raw is not None else encode({"sent_by": "webhook-inbox send"})
    envelope = {
        "message": {
            "attributes": attributes,
            "data": base64.b64encode(data).decode(),
            "messageId": message_id,
            "message_id": message_id,
            "publishTime": iso_now(),
        },
        "subscription": "projects/local/subscriptions/webhook-inbox-send",
    }
    return Delivery(encode(envelope), message_id, {"content-type": JSON}, token_query(source))


def sns(source: AnySource, wanted: Wanted) -> Delivery:
    raise CannotBuild(
        f"source {source.name!r} is kind sns: SNS signs with a certificate only AWS holds "
        "(fetched from sns.<region>.amazonaws.com), so send cannot make a delivery it accepts; "
        "publish to the topic with `aws sns publish` instead"
    )


def cloud_event(wanted: Wanted) -> dict[str, Any]:
    return {
        "specversion": "1.0",
        "id": wanted.message_id or new_id(),
        "source": CLOUDEVENTS_SOURCE,
        "type": wanted.event_type or "test.event",
        "time": iso_now(),
        "datacontenttype": JSON,
        "data": wanted.payload if wanted.payload is not None else {},
    }


def eventgrid(source: AnySource, wanted: Wanted) -> Delivery:
    message_id = wanted.message_id or str(uuid.uuid4())
    event = {
        "id": message_id,
        "topic": "webhook-inbox-send",
        "subject": "webhook-inbox/send",
        "eventType": wanted.event_type or "Test.Event",
        "eventTime": iso_now(),
        "data": wanted.payload if wanted.payload is not None else {},
        "dataVersion": "1.0",
    }
    headers = {"content-type": JSON}
    if source.config.key_header:
        headers[source.config.key_header] = source.config.secrets[0].get_secret_value()
    return Delivery(encode([event]), message_id, headers, token_query(source))


def cloudevents(source: AnySource, wanted: Wanted) -> Delivery:
    event = cloud_event(wanted)
    body = encode(event)
    headers = {"content-type": STRUCTURED} | signed_hmac(source.config.hmac, source, body)
    message_id = dedup_key(event["source"], event["id"])
    return Delivery(body, message_id, headers, token_query(source))


def dapr(source: AnySource, wanted: Wanted) -> Delivery:
    event = cloud_event(wanted) | {"pubsubname": "webhook-inbox-send", "topic": source.name}
    headers = {"content-type": STRUCTURED}
    if source.config.app_api_token is not None:
        headers["dapr-api-token"] = source.config.app_api_token.get_secret_value()
    message_id = dedup_key(event["source"], event["id"])
    return Delivery(encode(event), message_id, headers, token_query(source))


BUILDERS: dict[str, Callable[[AnySource, Wanted], Delivery]] = {
    "generic": generic,
    "standard-webhooks": standard_webhooks,
    "stripe": stripe,
    "github": github,
    "shopify": shopify,
    "slack": slack,
    "pubsub": pubsub,
    "sns": sns,
    "eventgrid": eventgrid,
    "cloudevents": cloudevents,
    "dapr": dapr,
}


def build_delivery(source: AnySource, wanted: Wanted) -> Delivery:
    """The delivery `source` accepts, carrying what `wanted` asks for; `CannotBuild` if none."""
    return BUILDERS[source.kind](source, wanted)
