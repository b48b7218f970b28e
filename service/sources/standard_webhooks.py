"""Standard Webhooks (and Svix): `v1,` base64 HMAC-SHA256 of `id.timestamp.body` with `whsec_`
secrets, and `v1a,` base64 ed25519 signatures of the same bytes with `whpk_` public keys."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from functools import cached_property
from typing import Annotated

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    SecretStr,
    field_validator,
    model_validator,
)

from service.sources import signing
from service.sources.base import (
    Message,
    Messages,
    RawDelivery,
    Source,
    Unauthenticated,
    parse_json,
    require_json_media_type,
)
from service.sources.config import SourceConfig, is_set, resolve_secret
from service.sources.limits import checked_event_type, checked_message_id
from service.sources.signing import KeyedHmac, keyed_macs, require_mac_match

SECRET_PREFIX = "whsec_"
PUBLIC_KEY_PREFIX = "whpk_"
# The `v1a` entries of one header that are checked, in order; the rest are passed over.
MAX_V1A_SIGNATURES = 4


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


def decode_public_key(key: str) -> Ed25519PublicKey:
    """The ed25519 key of a `whpk_<base64>` public key (the prefix is optional)."""
    try:
        raw = base64.b64decode(key.removeprefix(PUBLIC_KEY_PREFIX), validate=True)
        return Ed25519PublicKey.from_public_bytes(raw)
    except (binascii.Error, ValueError):
        raise ValueError(
            "public key is not whpk_ followed by the base64 of a 32-byte ed25519 key"
        ) from None


def _checked_public_key(key: str) -> str:
    decode_public_key(key)
    return key


# Not secret, but `env:NAME` reads one from the environment as for secrets.
PublicKey = Annotated[str, BeforeValidator(resolve_secret), AfterValidator(_checked_public_key)]


def signed_content(msg_id: str, timestamp: int, body: bytes) -> bytes:
    return f"{msg_id}.{timestamp}.".encode() + body


def _digest(key: bytes, msg_id: str, timestamp: int, body: bytes) -> bytes:
    return hmac.new(key, signed_content(msg_id, timestamp, body), hashlib.sha256).digest()


def sign(key: bytes, msg_id: str, timestamp: int, body: bytes) -> str:
    """The `v1,<base64>` signature the sender puts in `webhook-signature`."""
    return "v1," + base64.b64encode(_digest(key, msg_id, timestamp, body)).decode()


def _b64_or_empty(text: str) -> bytes:
    # As strict as b64decode(validate=True), without its Python wrapper and pattern match.
    try:
        return binascii.a2b_base64(text, strict_mode=True)
    except (binascii.Error, ValueError):
        return b""


def _ed25519_verifies(key: Ed25519PublicKey, signature: bytes, content: bytes) -> bool:
    try:
        key.verify(signature, content)
    except InvalidSignature:
        return False
    return True


class StandardWebhooksConfig(SourceConfig):
    # `v1a` (asymmetric) senders: their public keys; several = key rotation, any verifies.
    public_keys: list[PublicKey] = Field(default_factory=list)

    @field_validator("secrets")
    @classmethod
    def _secrets_decode(cls, value: list[SecretStr]) -> list[SecretStr]:
        for secret in filter(is_set, value):
            decode_secret(secret.get_secret_value())
        return value

    @model_validator(mode="after")
    def _has_key(self) -> StandardWebhooksConfig:
        if not self.secrets and not self.public_keys:
            raise ValueError(
                "standard-webhooks needs at least one secret (whsec_..., for v1 signatures) "
                "or public key (public_keys, whpk_..., for v1a)"
            )
        return self


# Where each header of the scheme goes in `_signing_headers`' answer; Svix sends the same
# scheme under `svix-*` names, read only when the `webhook-*` one is missing or empty.
_SIGNING_HEADERS = {
    b"webhook-id": 0,
    b"webhook-timestamp": 1,
    b"webhook-signature": 2,
    b"svix-id": 3,
    b"svix-timestamp": 4,
    b"svix-signature": 5,
}


def _signing_headers(delivery: RawDelivery) -> tuple[str, str, str]:
    """The id, timestamp and signature headers ("" where missing), each as `Headers.get`
    reads it (the first of its name), in one walk of the header list instead of three."""
    found: list[bytes | None] = [None] * 6
    for name, value in delivery.raw_headers:
        slot = _SIGNING_HEADERS.get(name)
        if slot is not None and found[slot] is None:
            found[slot] = value
    webhook_id, webhook_ts, webhook_sig, svix_id, svix_ts, svix_sig = found
    return (
        (webhook_id or svix_id or b"").decode("latin-1"),
        (webhook_ts or svix_ts or b"").decode("latin-1"),
        (webhook_sig or svix_sig or b"").decode("latin-1"),
    )


class StandardWebhooksSource(Source[StandardWebhooksConfig]):
    kind = "standard-webhooks"
    sensitive_headers = frozenset({"webhook-signature", "svix-signature"})
    redelivery_days = 3.0  # Svix's schedule ends about 27 hours after the first try

    def __init__(self, name: str, config: StandardWebhooksConfig) -> None:
        super().__init__(name, config)
        self.public_keys = [decode_public_key(k) for k in config.public_keys]
        # The signature versions this source can check: `v1` with secrets, `v1a` with keys.
        self.versions = ("v1",) * bool(config.secrets) + ("v1a",) * bool(self.public_keys)

    @cached_property
    def keys(self) -> list[bytes]:
        return [decode_secret(s.get_secret_value()) for s in self.config.secrets]

    @cached_property
    def macs(self) -> list[KeyedHmac]:
        return keyed_macs(self.keys)

    async def verify(self, delivery: RawDelivery) -> Messages:
        msg_id, timestamp_text, signature_header = _signing_headers(delivery)
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
        skew = signing.now() - timestamp
        if skew > self.tolerance_seconds:
            raise Unauthenticated("webhook-timestamp is too old (outside tolerance)")
        if -skew > self.tolerance_seconds:
            raise Unauthenticated("webhook-timestamp is in the future (outside tolerance)")

        self._check_signatures(signature_header, msg_id, timestamp, delivery.body)

        require_json_media_type(delivery)
        message_id = checked_message_id(msg_id, "the webhook-id header")
        payload = parse_json(delivery.body)
        event_type = payload.get("type") if isinstance(payload, dict) else None
        return Messages(
            [Message(message_id, checked_event_type(event_type, "the JSON field type"))]
        )

    def _check_signatures(self, header: str, msg_id: str, timestamp: int, body: bytes) -> None:
        """401 unless one of the header's space-separated `version,signature` entries verifies
        with a configured key; versions this source has no key for are passed over (spec)."""
        # Every delivery comes this way: two lists and one keyed HMAC a secret, nothing built
        # for the versions a sender did not use.
        v1: list[bytes] = []
        v1a: list[bytes] = []
        for entry in header.split(" "):
            version, comma, signature = entry.partition(",")
            if comma and version == "v1":
                v1.append(_b64_or_empty(signature))
            elif comma and version == "v1a":
                v1a.append(_b64_or_empty(signature))
        if not (self.macs and v1) and not (self.public_keys and v1a):
            raise Unauthenticated(
                f"webhook-signature has no {' or '.join(self.versions)} signature"
            )
        content = signed_content(msg_id, timestamp, body)
        if self.public_keys and v1a and self._v1a_verifies(v1a, content):
            return
        require_mac_match(self.macs, content, v1, "no webhook-signature matches a configured key")

    def _v1a_verifies(self, offered: list[bytes], content: bytes) -> bool:
        # Each one costs an ed25519 verification, before anything is authenticated: a header
        # full of them must not buy a stranger that much CPU. Senders offer one or two.
        ed25519_signatures = [s for s in offered if len(s) == 64][:MAX_V1A_SIGNATURES]
        return any(
            _ed25519_verifies(key, signature, content)
            for key in self.public_keys
            for signature in ed25519_signatures
        )

    def example_curl(self, base_url: str) -> str | None:
        if not self.keys:
            return None  # a v1a source: only the sender's private key can sign
        body = json.dumps({"type": "demo.created", "data": {"hello": "world"}}).encode()
        msg_id, at = "msg_demo_1", int(signing.now())
        signature = sign(self.keys[0], msg_id, at, body)
        headers = {
            "webhook-id": msg_id,
            "webhook-timestamp": str(at),
            "webhook-signature": signature,
        }
        return self.curl_json(base_url, headers, body.decode())
