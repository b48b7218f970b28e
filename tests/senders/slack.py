"""What Slack sends: its documented signing example, and Events API callbacks signed as Slack
signs them."""

from __future__ import annotations

import json
import time
from typing import Any

from service.sources.slack import slack_signature

# api.slack.com/authentication/verifying-requests-from-slack, also the fixture of
# slack_sdk's tests/slack_sdk/signature/test_signature_verifier.py.
DOC_SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
DOC_TIMESTAMP = "1531420618"
DOC_BODY = (
    b"token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow"
    b"&channel_id=G8PSS9T3V&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner"
    b"&command=%2Fwebhook-collect&text=&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands"
    b"%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN"
    b"&trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c"
)
DOC_SIGNATURE = "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503"

SECRET = "0123456789abcdef0123456789abcdef"
OLD_SECRET = "fedcba9876543210fedcba9876543210"
CONFIG: dict[str, Any] = {"sources": {"slack": {"kind": "slack", "secrets": [OLD_SECRET, SECRET]}}}


def callback(event_id: str | None = "Ev0PV52K21", event_type: str = "app_mention") -> bytes:
    payload: dict[str, Any] = {
        "token": "XXYYZZ",
        "team_id": "T123ABC456",
        "api_app_id": "A123ABC456",
        "event": {"type": event_type, "user": "U123ABC456", "event_ts": "1465244570.336841"},
        "type": "event_callback",
        "event_time": 1465244570,
    }
    if event_id is not None:
        payload["event_id"] = event_id
    return json.dumps(payload).encode()


def signed(
    body: bytes, secret: str = SECRET, timestamp: int | None = None
) -> tuple[bytes, dict[str, str]]:
    ts = str(int(time.time()) if timestamp is None else timestamp)
    return body, {
        "content-type": "application/json",
        "x-slack-request-timestamp": ts,
        "x-slack-signature": slack_signature(secret.encode(), ts, body),
    }
