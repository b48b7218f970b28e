"""Slack Events API: `v0=` hex HMAC-SHA256 of `v0:ts:body`; `event_id` is the key."""

from __future__ import annotations

import json

from service.sources.base import (
    BadDelivery,
    Handshake,
    HeaderName,
    Message,
    Messages,
    RawDelivery,
    UnsupportedMediaType,
    parse_json,
)
from service.sources.limits import checked_event_type, checked_message_id
from service.sources.signing import (
    SignedSource,
    check_timestamp,
    hmac_sha256,
    now,
    require_match,
)

SIGNATURE_HEADER = HeaderName("X-Slack-Signature")
TIMESTAMP_HEADER = HeaderName("X-Slack-Request-Timestamp")
VERSION = "v0"


def slack_signature(secret: bytes, timestamp: str, body: bytes) -> str:
    """The `X-Slack-Signature` value: `v0=` + hex HMAC-SHA256 of `v0:{timestamp}:{body}`."""
    return _header_value(hmac_sha256(secret, _signed(timestamp, body)))


def _header_value(digest: bytes) -> str:
    return f"{VERSION}=" + digest.hex()


def _signed(timestamp: str, body: bytes) -> bytes:
    return f"{VERSION}:{timestamp}:".encode() + body


class SlackSource(SignedSource):
    kind = "slack"
    sensitive_headers = frozenset({"x-slack-signature"})
    # Slack retries a failed event 3 times: at once, after 1 minute, after 5 minutes
    # (api.slack.com/apis/events-api#retries). A day is the smallest window worth configuring.
    redelivery_days = 1.0

    async def verify(self, delivery: RawDelivery) -> Messages | Handshake:
        offered = SIGNATURE_HEADER.required(delivery.raw_headers)
        timestamp = TIMESTAMP_HEADER.required(delivery.raw_headers).strip()
        signed = _signed(timestamp, delivery.body)
        require_match(
            (_header_value(mac.digest(signed)) for mac in self.macs),
            [offered.strip()],
            f"{SIGNATURE_HEADER.name} does not match a configured secret",
        )
        check_timestamp(timestamp, TIMESTAMP_HEADER.name, self.tolerance_seconds)

        media = delivery.media_type
        if media and media != "application/json":
            # Slash commands and interactivity post forms without an event_id to dedupe on.
            raise UnsupportedMediaType(
                f"content type {media!r} is not JSON; this source reads Events API callbacks"
            )
        payload = parse_json(delivery.body)
        if not isinstance(payload, dict):
            raise BadDelivery("body is not a JSON object; expected an Events API callback")
        if payload.get("type") == "url_verification":
            return self._challenge(payload.get("challenge"))

        message_id = checked_message_id(payload.get("event_id"), "the JSON field event_id")
        event = payload.get("event")
        event_type = event.get("type") if isinstance(event, dict) else None
        return Messages(
            [Message(message_id, checked_event_type(event_type, "the JSON field event.type"))]
        )

    @staticmethod
    def _challenge(challenge: object) -> Handshake:
        """Answer the signed Request URL check by echoing its challenge; nothing is recorded."""
        if not isinstance(challenge, str) or not challenge:
            raise BadDelivery("url_verification without a challenge string")
        return Handshake(200, {"challenge": challenge})

    def example_curl(self, base_url: str) -> str | None:
        body = json.dumps(
            {
                "type": "event_callback",
                "event_id": "Ev0DEMO0001",
                "event": {"type": "app_mention", "text": "hello"},
            }
        )
        ts = str(int(now()))
        signature = slack_signature(self.config.secret_values()[0], ts, body.encode())
        headers = {TIMESTAMP_HEADER.name: ts, SIGNATURE_HEADER.name: signature}
        return self.curl_json(base_url, headers, body)
