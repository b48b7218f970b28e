"""Amazon SNS HTTP/S subscriptions: signature v1/v2, certificate host rule, topic allow-list."""

from __future__ import annotations

import base64
import binascii
import logging
import re
from collections import OrderedDict
from typing import Any, Protocol
from urllib.parse import urlsplit

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from pydantic import Field, model_validator

from service.sources.base import (
    BadDelivery,
    Handshake,
    Message,
    Messages,
    RawDelivery,
    Rejected,
    Source,
    Unauthenticated,
    UnsupportedMediaType,
    parse_json,
)
from service.sources.config import SourceConfig
from service.sources.limits import checked_event_type, checked_message_id

log = logging.getLogger("service.sources.sns")

# The AWS SDKs' rule for where SNS certificates live (aws-php-sns-message-validator,
# sns-validator): https://sns.<region>.amazonaws.com[.cn]/...pem. Not configurable, so that no
# setting can make us trust a key an attacker serves.
SNS_HOST = re.compile(r"^sns\.[a-z0-9\-]{3,}\.amazonaws\.com(\.cn)?$")

# The string-to-sign: these fields, in this (byte-sorted) order, each as "Name\nValue\n"
# (https://docs.aws.amazon.com/sns/latest/dg/sns-verify-signature-of-message.html).
NOTIFICATION_FIELDS = ("Message", "MessageId", "Subject", "Timestamp", "TopicArn", "Type")
CONFIRMATION_FIELDS = (
    "Message",
    "MessageId",
    "SubscribeURL",
    "Timestamp",
    "Token",
    "TopicArn",
    "Type",
)
SIGNED_FIELDS = {
    "Notification": NOTIFICATION_FIELDS,
    "SubscriptionConfirmation": CONFIRMATION_FIELDS,
    "UnsubscribeConfirmation": CONFIRMATION_FIELDS,
}
OPTIONAL_FIELDS = frozenset({"Subject"})
HASHES: dict[str, type[hashes.HashAlgorithm]] = {"1": hashes.SHA1, "2": hashes.SHA256}
CERT_CACHE_SIZE = 32


class Forbidden(Rejected):
    status = 403
    reason = "forbidden"


class SnsUnreachable(Rejected):
    status = 503
    reason = "sns_unreachable"


class SnsFetcher(Protocol):
    """The two HTTP calls SNS needs; only URLs that passed the host rule are ever passed in."""

    async def certificate_pem(self, url: str) -> bytes: ...

    async def confirm_subscription(self, url: str) -> None: ...


class HttpsFetcher:
    """The production fetcher: plain httpx GETs, TLS verified, no redirects.

    httpx is imported where it is used (here and where its errors are caught): every process
    that loads the sources file would pay for it at start, and only an SNS delivery needs it.
    """

    async def certificate_pem(self, url: str) -> bytes:
        import httpx

        async with httpx.AsyncClient(timeout=10.0, follow_redirects=False) as client:
            response = await client.get(url)
            response.raise_for_status()
            return response.content

    async def confirm_subscription(self, url: str) -> None:
        import httpx

        async with httpx.AsyncClient(timeout=10.0, follow_redirects=False) as client:
            response = await client.get(url)
            response.raise_for_status()


def is_sns_url(url: str) -> bool:
    """True for https://sns.<region>.amazonaws.com[.cn]/... on the default port."""
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        return False
    return (
        parts.scheme == "https"
        and port in (None, 443)
        and parts.username is None
        and parts.password is None
        and SNS_HOST.fullmatch(parts.hostname or "") is not None
    )


def is_certificate_url(url: str) -> bool:
    return is_sns_url(url) and urlsplit(url).path.endswith(".pem")


def string_to_sign(message: dict[str, Any]) -> bytes:
    """The canonical bytes SNS signed for `message`, per its `Type`."""
    lines: list[str] = []
    for name in SIGNED_FIELDS[message["Type"]]:
        value = message.get(name)
        if value is None and name in OPTIONAL_FIELDS:
            continue
        if not isinstance(value, str):
            raise Unauthenticated(f"the signed field {name} is missing or not a string")
        lines.append(f"{name}\n{value}\n")
    # A JSON escape can put an unpaired surrogate in a field; SNS never signs one, so its
    # bytes only need to exist for the signature check to fail.
    return "".join(lines).encode("utf-8", "surrogatepass")


class SnsConfig(SourceConfig):
    # Topics whose messages are accepted; ["*"] accepts any topic of any AWS account.
    topic_arns: list[str] = Field(min_length=1)
    auto_confirm: bool = False
    event_type_attribute: str | None = Field(default=None, min_length=1)

    @model_validator(mode="after")
    def _arns(self) -> SnsConfig:
        for arn in self.topic_arns:
            if arn != "*" and not arn.startswith("arn:"):
                raise ValueError(f"topic_arns entry {arn!r} is not an ARN (arn:aws:sns:...)")
        return self


class SnsSource(Source[SnsConfig]):
    kind = "sns"
    # HTTP/S delivery policies retry for at most 3,600 seconds (a hard limit); one day leaves
    # room for manual redrives from a dead-letter queue soon after.
    redelivery_days = 1.0

    def __init__(self, name: str, config: SnsConfig, fetcher: SnsFetcher | None = None) -> None:
        super().__init__(name, config)
        self.fetcher: SnsFetcher = fetcher or HttpsFetcher()
        self._keys: OrderedDict[str, rsa.RSAPublicKey] = OrderedDict()
        # What `verify` reads of the config on every delivery, read once (see `Source`).
        self._topic_arns = tuple(config.topic_arns)
        self._event_type_attribute = config.event_type_attribute

    async def verify(self, delivery: RawDelivery) -> Messages | Handshake:
        # SNS sends text/plain by default; a delivery policy may change it to JSON.
        if delivery.media_type not in ("", "text/plain", "application/json"):
            raise UnsupportedMediaType(
                f"content type {delivery.media_type!r}: SNS sends a JSON document as text/plain"
            )
        # SNS signs fields of the JSON document, not its bytes: it must be parsed first.
        message = parse_json(delivery.body)
        if not isinstance(message, dict):
            raise BadDelivery("an SNS message is a JSON object")
        kind = message.get("Type")
        if kind not in SIGNED_FIELDS:
            raise BadDelivery(
                "field Type must be Notification, SubscriptionConfirmation or "
                "UnsubscribeConfirmation"
            )
        message_id = checked_message_id(message.get("MessageId"), "the field MessageId")
        await self._check_signature(message)

        topic = message.get("TopicArn")
        if "*" not in self._topic_arns and topic not in self._topic_arns:
            raise Forbidden(f"TopicArn {topic!r} is not in topic_arns")
        if kind == "SubscriptionConfirmation":
            return await self._subscription_confirmation(message)
        if kind == "UnsubscribeConfirmation":
            log.info("sns unsubscribe confirmed", extra={"source": self.name, "topic_arn": topic})
            return Handshake(200, {"status": "unsubscribed", "topic_arn": topic})
        return Messages([Message(message_id, self._event_type(message))])

    def _event_type(self, message: dict[str, Any]) -> str | None:
        name = self._event_type_attribute
        if name is None:
            return checked_event_type(message.get("Subject"), "the field Subject")
        attributes = message.get("MessageAttributes")
        attribute = attributes.get(name) if isinstance(attributes, dict) else None
        value = attribute.get("Value") if isinstance(attribute, dict) else None
        return checked_event_type(value, f"the field MessageAttributes.{name}.Value")

    async def _check_signature(self, message: dict[str, Any]) -> None:
        version = message.get("SignatureVersion")
        if version not in HASHES:
            raise Unauthenticated("SignatureVersion must be 1 or 2")
        cert_url = message.get("SigningCertURL")
        if not isinstance(cert_url, str) or not is_certificate_url(cert_url):
            # Checked before any fetch: an attacker's URL is never requested.
            raise Unauthenticated(
                "SigningCertURL must be https://sns.<region>.amazonaws.com[.cn]/....pem"
            )
        signature_text = message.get("Signature")
        try:
            signature = base64.b64decode(str(signature_text or ""), validate=True)
        except (binascii.Error, ValueError):
            signature = b""
        if not signature:
            raise Unauthenticated("missing or malformed Signature")
        key = await self._public_key(cert_url)
        try:
            key.verify(signature, string_to_sign(message), padding.PKCS1v15(), HASHES[version]())
        except InvalidSignature:
            raise Unauthenticated("Signature does not verify") from None

    async def _public_key(self, url: str) -> rsa.RSAPublicKey:
        cached = self._keys.get(url)
        if cached is not None:
            self._keys.move_to_end(url)
            return cached
        import httpx

        try:
            pem = await self.fetcher.certificate_pem(url)
        except httpx.HTTPError:
            raise SnsUnreachable(f"could not fetch the signing certificate {url}") from None
        try:
            key = x509.load_pem_x509_certificate(pem).public_key()
        except ValueError:
            raise Unauthenticated("SigningCertURL does not hold a PEM certificate") from None
        if not isinstance(key, rsa.RSAPublicKey):
            raise Unauthenticated("the signing certificate's key is not RSA")
        self._keys[url] = key
        while len(self._keys) > CERT_CACHE_SIZE:
            self._keys.popitem(last=False)
        return key

    async def _subscription_confirmation(self, message: dict[str, Any]) -> Handshake:
        topic = message.get("TopicArn")
        subscribe_url = message["SubscribeURL"]  # signed, so present and a string
        if not self.config.auto_confirm:
            # The URL confirms the subscription and nothing else; the operator needs it.
            log.info(
                "sns subscription awaits confirmation",
                extra={"source": self.name, "topic_arn": topic, "subscribe_url": subscribe_url},
            )
            return Handshake(200, {"status": "confirmation_pending", "topic_arn": topic})
        if not is_sns_url(subscribe_url):
            raise Forbidden("SubscribeURL is not on https://sns.<region>.amazonaws.com[.cn]")
        import httpx

        try:
            await self.fetcher.confirm_subscription(subscribe_url)
        except httpx.HTTPError:
            raise SnsUnreachable("could not confirm the subscription; SNS will retry") from None
        log.info("sns subscription confirmed", extra={"source": self.name, "topic_arn": topic})
        return Handshake(200, {"status": "confirmed", "topic_arn": topic})
