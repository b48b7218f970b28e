"""The slack kind: Slack's documented example, the url_verification handshake, Events API."""

from __future__ import annotations

import json
import time
from typing import Any

import asyncpg
import pytest

from service.core.settings import ConfigError
from service.sources import signing
from service.sources.config_file import parse_inbox_config
from service.sources.slack import slack_signature
from tests.conftest import AppFactory
from tests.sources.helpers import assert_rejected, count_rows, only_row

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


def test_documented_example() -> None:
    assert slack_signature(DOC_SECRET.encode(), DOC_TIMESTAMP, DOC_BODY) == DOC_SIGNATURE


def test_slack_needs_a_secret() -> None:
    with pytest.raises(ConfigError, match="slack needs at least one entry in secrets"):
        parse_inbox_config({"sources": {"s": {"kind": "slack"}}})


async def test_documented_example_over_http_at_its_own_time(
    client_for: AppFactory, db: asyncpg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(signing, "now", lambda: float(DOC_TIMESTAMP))
    config = {"sources": {"slack": {"kind": "slack", "secrets": [DOC_SECRET]}}}
    headers = {
        "content-type": "application/x-www-form-urlencoded",
        "x-slack-request-timestamp": DOC_TIMESTAMP,
        "x-slack-signature": DOC_SIGNATURE,
    }
    async with client_for(config) as client:
        good = await client.post("/webhooks/slack", content=DOC_BODY, headers=headers)
        bad = await client.post("/webhooks/slack", content=DOC_BODY + b"-", headers=headers)
    # Authentic, but a slash command (a form without event_id) is not an Events API callback.
    await assert_rejected(good, db, 415, "Events API")
    await assert_rejected(bad, db, 401, "X-Slack-Signature does not match")


async def test_documented_example_is_stale_today(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    config = {"sources": {"slack": {"kind": "slack", "secrets": [DOC_SECRET]}}}
    headers = {"x-slack-request-timestamp": DOC_TIMESTAMP, "x-slack-signature": DOC_SIGNATURE}
    async with client_for(config) as client:
        response = await client.post("/webhooks/slack", content=DOC_BODY, headers=headers)
    await assert_rejected(response, db, 401, "too old")


async def test_url_verification_echoes_the_challenge_and_records_nothing(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    body = json.dumps(
        {
            "token": "Jhj5dZrVaK7ZwHHjRyZWjbDl",
            "challenge": "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P",
            "type": "url_verification",
        }
    ).encode()
    async with client_for(CONFIG) as client:
        response = await client.post("/webhooks/slack", content=body, headers=signed(body)[1])
        unsigned = await client.post(
            "/webhooks/slack", content=body, headers={"content-type": "application/json"}
        )
    assert response.status_code == 200
    assert response.json() == {"challenge": "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P"}
    assert unsigned.status_code == 401
    assert await count_rows(db) == 0


async def test_event_is_recorded_and_a_retry_is_a_duplicate(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    body = callback("Ev0DUP", "reaction_added")
    async with client_for(CONFIG) as client:
        first = await client.post("/webhooks/slack", content=body, headers=signed(body)[1])
        # Slack's retry is signed afresh and numbered, with the same event_id.
        _, retry_headers = signed(body, timestamp=int(time.time()) + 1)
        retry_headers |= {"x-slack-retry-num": "1", "x-slack-retry-reason": "http_timeout"}
        again = await client.post("/webhooks/slack", content=body, headers=retry_headers)
    assert first.json()["status"] == "accepted"
    assert first.json()["message_id"] == "Ev0DUP"
    assert again.status_code == 200
    assert again.json() == {"status": "duplicate", "message_id": "Ev0DUP"}
    row = await only_row(db)
    assert row["event_type"] == "reaction_added"
    assert row["receive_count"] == 2
    assert row["headers"]["x-slack-signature"] == "[redacted]"


async def test_rotated_secret_verifies(client_for: AppFactory) -> None:
    body = callback("Ev0OLD")
    async with client_for(CONFIG) as client:
        response = await client.post(
            "/webhooks/slack", content=body, headers=signed(body, secret=OLD_SECRET)[1]
        )
    assert response.json()["status"] == "accepted"


def _tampered_body() -> tuple[bytes, dict[str, str]]:
    body, headers = signed(callback())
    return body.replace(b"app_mention", b"app_mentioN"), headers


def _tampered_signature() -> tuple[bytes, dict[str, str]]:
    body, headers = signed(callback())
    sig = headers["x-slack-signature"]
    headers["x-slack-signature"] = sig[:-1] + ("0" if sig[-1] != "0" else "1")
    return body, headers


def _tampered_timestamp() -> tuple[bytes, dict[str, str]]:
    body, headers = signed(callback())
    headers["x-slack-request-timestamp"] = str(int(headers["x-slack-request-timestamp"]) - 1)
    return body, headers


def _without(name: str) -> tuple[bytes, dict[str, str]]:
    body, headers = signed(callback())
    del headers[name]
    return body, headers


REJECTIONS = {
    "tampered body": (_tampered_body, 401, "X-Slack-Signature does not match"),
    "tampered signature": (_tampered_signature, 401, "X-Slack-Signature does not match"),
    "tampered timestamp": (_tampered_timestamp, 401, "X-Slack-Signature does not match"),
    "wrong secret": (
        lambda: signed(callback(), secret="not-the-signing-secret"),
        401,
        "does not match a configured secret",
    ),
    "stale timestamp": (
        lambda: signed(callback(), timestamp=int(time.time()) - 301),
        401,
        "too old",
    ),
    "future timestamp": (
        lambda: signed(callback(), timestamp=int(time.time()) + 360),
        401,
        "in the future",
    ),
    "missing signature": (
        lambda: _without("x-slack-signature"),
        401,
        "missing X-Slack-Signature header",
    ),
    "missing timestamp": (
        lambda: _without("x-slack-request-timestamp"),
        401,
        "missing X-Slack-Request-Timestamp header",
    ),
    "missing event_id": (lambda: signed(callback(event_id=None)), 400, "event_id"),
    "url_verification without challenge": (
        lambda: signed(b'{"type": "url_verification"}'),
        400,
        "challenge",
    ),
    "malformed JSON": (lambda: signed(b'{"event_id": '), 400, "not valid JSON"),
}


@pytest.mark.parametrize("case", list(REJECTIONS))
async def test_rejections_record_nothing(
    client_for: AppFactory, db: asyncpg.Connection, case: str
) -> None:
    build, status, detail = REJECTIONS[case]
    body, headers = build()
    async with client_for(CONFIG) as client:
        response = await client.post("/webhooks/slack", content=body, headers=headers)
    await assert_rejected(response, db, status, detail)
