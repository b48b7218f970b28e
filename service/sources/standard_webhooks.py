"""Standard Webhooks (and Svix): `v1,` base64 HMAC-SHA256 of `id.timestamp.body`, `whsec_` keys."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import time
from typing import ClassVar

from pydantic import SecretStr, field_validator, model_validator

from service.sources.base import (
    Message,
    Messages,
    RawDelivery,
    Source,
    Unauthenticated,
    parse_json,
    require_json_media_type,
)
from service.sources.config import SourceConfig
from service.sources.limits import checked_event_type, checked_message_id
from service.sources.signing import require_match

SECRET_PREFIX = "whsec_"


def decode_secret(secret: str) -> bytes:
    """The HMAC key of a `whsec_<base64>` secret (the prefix is optional), as the SDKs decode it."""
    raw = secret.removeprefix(SECRET_PREFIX)
    try:
        key = base64.b64decode(raw + "==", validate=False)
    except (binascii.Error, ValueError) as exc:
        raise ValueError("secret is not whsec_ followed by base64") from exc
    if not key:
        raise ValueError("secret decodes to an empty key")
    return key


def _digest(key: bytes, msg_id: str, timestamp: int, body: bytes) -> bytes:
    to_sign = f"{msg_id}.{timestamp}.".encode() + body
    return hmac.new(key, to_sign, hashlib.sha256).digest()


def sign(key: bytes, msg_id: str, timestamp: int, body: bytes) -> str:
    """The `v1,<base64>` signature the sender puts in `webhook-signature`."""
    return "v1," + base64.b64encode(_digest(key, msg_id, timestamp, body)).decode()


def _b64_or_empty(text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return b""


class StandardWebhooksConfig(SourceConfig):
    @field_validator("secrets")
    @classmethod
    def _secrets_decode(cls, value: list[SecretStr]) -> list[SecretStr]:
        for secret in value:
            decode_secret(secret.get_secret_value())
        return value

    @model_validator(mode="after")
    def _has_secret(self) -> StandardWebhooksConfig:
        if not self.secrets:
            raise ValueError("standard-webhooks needs at least one secret (whsec_...)")
        return self


def _header(delivery: RawDelivery, name: str) -> str | None:
    # Svix sends the same scheme under `svix-*` names.
    return delivery.headers.get(f"webhook-{name}") or delivery.headers.get(f"svix-{name}")


class StandardWebhooksSource(Source[SourceConfig]):
    kind = "standard-webhooks"
    config_model: ClassVar[type[SourceConfig]] = StandardWebhooksConfig
    sensitive_headers = frozenset({"webhook-signature", "svix-signature"})
    redelivery_days = 3.0  # Svix's schedule ends about 27 hours after the first try

    def __init__(self, name: str, config: SourceConfig) -> None:
        super().__init__(name, config)
        self.keys = [decode_secret(s.get_secret_value()) for s in config.secrets]

    async def verify(self, delivery: RawDelivery) -> Messages:
        msg_id = _header(delivery, "id")
        timestamp_text = _header(delivery, "timestamp")
        signature_header = _header(delivery, "signature")
        if not msg_id:
            raise Unauthenticated("missing webhook-id header")
        if not timestamp_text:
            raise Unauthenticated("missing webhook-timestamp header")
        if not signature_header:
            raise Unauthenticated("missing webhook-signature header")
        try:
            timestamp = int(timestamp_text)
        except ValueError:
            raise Unauthenticated("webhook-timestamp is not an integer") from None
        skew = time.time() - timestamp
        if skew > self.config.tolerance_seconds:
            raise Unauthenticated("webhook-timestamp is too old (outside tolerance)")
        if -skew > self.config.tolerance_seconds:
            raise Unauthenticated("webhook-timestamp is in the future (outside tolerance)")

        offered = [
            _b64_or_empty(sig.split(",", 1)[1])
            for sig in signature_header.split(" ")
            if sig.startswith("v1,")  # other versions (v1a: ed25519) are not ours to check
        ]
        if not offered:
            raise Unauthenticated("webhook-signature has no v1 signature")
        expected = [_digest(key, msg_id, timestamp, delivery.body) for key in self.keys]
        require_match(expected, offered, "no webhook-signature matches a configured secret")

        require_json_media_type(delivery)
        message_id = checked_message_id(msg_id, "the webhook-id header")
        payload = parse_json(delivery.body)
        event_type = payload.get("type") if isinstance(payload, dict) else None
        return Messages(
            [Message(message_id, checked_event_type(event_type, "the JSON field type"))]
        )

    def example_curl(self, base_url: str) -> str | None:
        body = json.dumps({"type": "demo.created", "data": {"hello": "world"}}).encode()
        msg_id, now = "msg_demo_1", int(time.time())
        signature = sign(self.keys[0], msg_id, now, body)
        return (
            f"curl -sS -X POST {base_url}/webhooks/{self.name} "
            "-H 'content-type: application/json' "
            f"-H 'webhook-id: {msg_id}' -H 'webhook-timestamp: {now}' "
            f"-H 'webhook-signature: {signature}' "
            f"--data '{body.decode()}'"
        )
