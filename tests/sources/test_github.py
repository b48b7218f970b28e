"""The github kind: GitHub's documented test vector, then deliveries on a real database."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlencode

import asyncpg
import pytest

from service.core.settings import ConfigError
from service.sources.config_file import parse_inbox_config
from service.sources.github import github_signature
from tests.conftest import AppFactory
from tests.sources.helpers import assert_rejected, only_row

# docs.github.com "Validating webhook deliveries" -> "Testing the webhook payload validation".
DOC_SECRET = "It's a Secret to Everybody"
DOC_PAYLOAD = b"Hello, World!"
DOC_SIGNATURE = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"

SECRET = "gh-webhook-secret-0123456789"
OLD_SECRET = "gh-webhook-secret-rotated-out"
CONFIG: dict[str, Any] = {"sources": {"gh": {"kind": "github", "secrets": [OLD_SECRET, SECRET]}}}


def signed(
    payload: dict[str, Any] | bytes,
    event: str = "issues",
    delivery: str | None = "72d3162e-cc78-11e3-81ab-4c9367dc0958",
    secret: str = SECRET,
) -> tuple[bytes, dict[str, str]]:
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    headers = {
        "content-type": "application/json",
        "x-github-event": event,
        "x-hub-signature-256": github_signature(secret.encode(), body),
        "user-agent": "GitHub-Hookshot/044aadd",
    }
    if delivery is not None:
        headers["x-github-delivery"] = delivery
    return body, headers


def test_documented_vector() -> None:
    assert github_signature(DOC_SECRET.encode(), DOC_PAYLOAD) == DOC_SIGNATURE


def test_github_needs_a_secret() -> None:
    with pytest.raises(ConfigError, match="github needs at least one entry in secrets"):
        parse_inbox_config({"sources": {"g": {"kind": "github"}}})


async def test_documented_vector_passes_verification_over_http(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    config = {"sources": {"gh": {"kind": "github", "secrets": [DOC_SECRET]}}}
    headers = {"x-hub-signature-256": DOC_SIGNATURE, "x-github-delivery": "d-1"}
    async with client_for(config) as client:
        good = await client.post("/webhooks/gh", content=DOC_PAYLOAD, headers=headers)
        bad = await client.post("/webhooks/gh", content=b"Hello, World?", headers=headers)
    # The signature holds, so what is refused is the body: "Hello, World!" is not an event.
    await assert_rejected(good, db, 400, "not valid JSON")
    await assert_rejected(bad, db, 401, "X-Hub-Signature-256 does not match")


async def test_event_with_action_is_recorded_and_redelivery_is_a_duplicate(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    body, headers = signed({"action": "opened", "issue": {"number": 1}})
    async with client_for(CONFIG) as client:
        first = await client.post("/webhooks/gh", content=body, headers=headers)
        again = await client.post("/webhooks/gh", content=body, headers=headers)
    assert first.status_code == 200
    assert first.json()["message_id"] == "72d3162e-cc78-11e3-81ab-4c9367dc0958"
    assert again.status_code == 200
    assert again.json()["status"] == "duplicate"
    row = await only_row(db)
    assert row["event_type"] == "issues.opened"
    assert row["receive_count"] == 2
    assert row["headers"]["x-hub-signature-256"] == "[redacted]"
    assert row["headers"]["x-github-event"] == "issues"


async def test_ping_is_accepted_like_any_event(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    body, headers = signed({"zen": "Keep it logically awesome.", "hook_id": 1}, event="ping")
    async with client_for(CONFIG) as client:
        response = await client.post("/webhooks/gh", content=body, headers=headers)
    assert response.json()["status"] == "accepted"
    assert (await only_row(db))["event_type"] == "ping"


async def test_form_encoded_delivery_reads_the_action_from_payload(
    client_for: AppFactory, db: asyncpg.Connection
) -> None:
    body = urlencode({"payload": json.dumps({"action": "created"})}).encode()
    _, headers = signed(body, event="star")
    headers["content-type"] = "application/x-www-form-urlencoded"
    async with client_for(CONFIG) as client:
        response = await client.post("/webhooks/gh", content=body, headers=headers)
    assert response.json()["status"] == "accepted"
    row = await only_row(db)
    assert row["event_type"] == "star.created"
    assert bytes(row["body"]) == body


async def test_rotated_secret_verifies(client_for: AppFactory) -> None:
    body, headers = signed({"action": "closed"}, secret=OLD_SECRET)
    async with client_for(CONFIG) as client:
        response = await client.post("/webhooks/gh", content=body, headers=headers)
    assert response.json()["status"] == "accepted"


def _tampered_body() -> tuple[bytes, dict[str, str]]:
    body, headers = signed({"action": "opened"})
    return body.replace(b"opened", b"closed"), headers


def _tampered_signature() -> tuple[bytes, dict[str, str]]:
    body, headers = signed({"action": "opened"})
    sig = headers["x-hub-signature-256"]
    headers["x-hub-signature-256"] = sig[:-1] + ("0" if sig[-1] != "0" else "1")
    return body, headers


def _without(name: str) -> tuple[bytes, dict[str, str]]:
    body, headers = signed({"action": "opened"})
    del headers[name]
    return body, headers


def _sha1_only() -> tuple[bytes, dict[str, str]]:
    # The legacy X-Hub-Signature (SHA-1) alone is not accepted.
    body, headers = _without("x-hub-signature-256")
    headers["x-hub-signature"] = "sha1=" + "0" * 40
    return body, headers


REJECTIONS = {
    "tampered body": (_tampered_body, 401, "X-Hub-Signature-256 does not match"),
    "tampered signature": (_tampered_signature, 401, "X-Hub-Signature-256 does not match"),
    "wrong secret": (
        lambda: signed({"action": "opened"}, secret="not-the-secret"),
        401,
        "does not match a configured secret",
    ),
    "missing signature header": (
        lambda: _without("x-hub-signature-256"),
        401,
        "missing X-Hub-Signature-256 header",
    ),
    "sha1 signature only": (_sha1_only, 401, "missing X-Hub-Signature-256 header"),
    "missing delivery id": (lambda: _without("x-github-delivery"), 400, "X-GitHub-Delivery"),
    "malformed JSON": (lambda: signed(b'{"action": '), 400, "not valid JSON"),
}


@pytest.mark.parametrize("case", list(REJECTIONS))
async def test_rejections_record_nothing(
    client_for: AppFactory, db: asyncpg.Connection, case: str
) -> None:
    build, status, detail = REJECTIONS[case]
    body, headers = build()
    async with client_for(CONFIG) as client:
        response = await client.post("/webhooks/gh", content=body, headers=headers)
    await assert_rejected(response, db, status, detail)


async def test_signed_xml_is_415(client_for: AppFactory, db: asyncpg.Connection) -> None:
    body, headers = signed(b"<issue/>")
    headers["content-type"] = "application/xml"
    async with client_for(CONFIG) as client:
        response = await client.post("/webhooks/gh", content=body, headers=headers)
    await assert_rejected(response, db, 415, "application/xml")
