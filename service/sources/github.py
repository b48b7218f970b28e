"""GitHub: `X-Hub-Signature-256: sha256=<hex HMAC of the body>`; `X-GitHub-Delivery` is the key."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import parse_qs

from service.sources.base import (
    BadDelivery,
    HeaderName,
    Message,
    Messages,
    RawDelivery,
    UnsupportedMediaType,
    first_header,
    is_json_media_type,
    parse_json,
)
from service.sources.limits import checked_event_type, checked_message_id
from service.sources.signing import SignedSource, hmac_sha256, require_match

SIGNATURE_HEADER = HeaderName("X-Hub-Signature-256")
DELIVERY_HEADER = HeaderName("X-GitHub-Delivery")
EVENT_HEADER = HeaderName("X-GitHub-Event")
PREFIX = "sha256="
FORM = "application/x-www-form-urlencoded"


def github_signature(secret: bytes, body: bytes) -> str:
    """The `X-Hub-Signature-256` value GitHub sends for `body`."""
    return _header_value(hmac_sha256(secret, body))


def _header_value(digest: bytes) -> str:
    return PREFIX + digest.hex()


class GitHubSource(SignedSource):
    kind = "github"
    sensitive_headers = frozenset({"x-hub-signature-256", "x-hub-signature"})
    # GitHub never redelivers on its own, but a person or script may redeliver a delivery (same
    # X-GitHub-Delivery) from the past 3 days on github.com and 7 days on Enterprise Server
    # (docs.github.com "Redelivering webhooks"); keep the longer window.
    redelivery_days = 7.0

    async def verify(self, delivery: RawDelivery) -> Messages:
        offered = SIGNATURE_HEADER.required(delivery.raw_headers)
        require_match(
            (_header_value(mac.digest(delivery.body)) for mac in self.macs),
            [offered.strip()],
            f"{SIGNATURE_HEADER.name} does not match a configured secret",
        )

        message_id = checked_message_id(
            first_header(delivery.raw_headers, DELIVERY_HEADER.raw), DELIVERY_HEADER.where
        )
        event = first_header(delivery.raw_headers, EVENT_HEADER.raw) or None
        action = _action(self._payload(delivery))
        event_type = checked_event_type(
            f"{event}.{action}" if event and action else event,
            f"the {EVENT_HEADER.name} header and the JSON field action",
        )
        return Messages([Message(message_id, event_type)])

    @staticmethod
    def _payload(delivery: RawDelivery) -> Any:
        """The event JSON, from a JSON body or the `payload` field of a form-encoded one.

        GitHub offers both content types when a webhook is created; the form one is its default.
        """
        media = delivery.media_type
        if media == FORM:
            try:
                form = parse_qs(delivery.body.decode("utf-8"), strict_parsing=True)
            except (UnicodeDecodeError, ValueError):
                raise BadDelivery("form body is malformed; expected payload=<JSON>") from None
            if "payload" not in form:
                raise BadDelivery("form body has no payload field")
            return parse_json(form["payload"][0].encode())
        if media and not is_json_media_type(media):
            raise UnsupportedMediaType(
                f"content type {media!r} is neither application/json nor {FORM}"
            )
        return parse_json(delivery.body)

    def example_curl(self, base_url: str) -> str | None:
        body = json.dumps({"zen": "Design for failure.", "hook_id": 1})
        signature = github_signature(self.config.secret_values()[0], body.encode())
        headers = {
            EVENT_HEADER.name: "ping",
            DELIVERY_HEADER.name: "00000000-demo",
            SIGNATURE_HEADER.name: signature,
        }
        return self.curl_json(base_url, headers, body)


def _action(payload: Any) -> str | None:
    action = payload.get("action") if isinstance(payload, dict) else None
    return action if isinstance(action, str) and action else None
