"""The github kind on its own: GitHub's documented test vector, secrets, and every refusal."""

from __future__ import annotations

import json
from urllib.parse import urlencode

import pytest

from service.core.settings import ConfigError
from service.sources.config_file import parse_inbox_config
from service.sources.github import github_signature
from tests.senders.github import (
    CONFIG,
    DOC_PAYLOAD,
    DOC_SECRET,
    DOC_SIGNATURE,
    OLD_SECRET,
    signed,
)
from tests.verdicts import assert_refused, assert_rejection, messages_of, refusal_of, source_of

SOURCE = source_of(CONFIG, "gh")


def test_documented_vector() -> None:
    assert github_signature(DOC_SECRET.encode(), DOC_PAYLOAD) == DOC_SIGNATURE


def test_github_needs_a_secret() -> None:
    with pytest.raises(ConfigError, match="github needs at least one entry in secrets"):
        parse_inbox_config({"sources": {"g": {"kind": "github"}}})


async def test_documented_vector_passes_verification() -> None:
    source = source_of({"sources": {"gh": {"kind": "github", "secrets": [DOC_SECRET]}}}, "gh")
    headers = {"x-hub-signature-256": DOC_SIGNATURE, "x-github-delivery": "d-1"}
    good = await refusal_of(source, DOC_PAYLOAD, headers)
    bad = await refusal_of(source, b"Hello, World?", headers)
    # The signature holds, so what is refused is the body: "Hello, World!" is not an event.
    assert_refused(good, 400, "not valid JSON")
    assert_refused(bad, 401, "X-Hub-Signature-256 does not match")


async def test_ping_is_accepted_like_any_event() -> None:
    body, headers = signed({"zen": "Keep it logically awesome.", "hook_id": 1}, event="ping")
    (message,) = (await messages_of(SOURCE, body, headers)).items
    assert message.message_id == "72d3162e-cc78-11e3-81ab-4c9367dc0958"
    assert message.event_type == "ping"


async def test_form_encoded_delivery_reads_the_action_from_payload() -> None:
    body = urlencode({"payload": json.dumps({"action": "created"})}).encode()
    _, headers = signed(body, event="star")
    headers["content-type"] = "application/x-www-form-urlencoded"
    (message,) = (await messages_of(SOURCE, body, headers)).items
    assert message.event_type == "star.created"
    assert message.body is None  # the request body is the message, stored as sent


async def test_rotated_secret_verifies() -> None:
    body, headers = signed({"action": "closed"}, secret=OLD_SECRET)
    (message,) = (await messages_of(SOURCE, body, headers)).items
    assert message.event_type == "issues.closed"


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
async def test_rejections_are_refused_naming_the_cause(case: str) -> None:
    await assert_rejection(SOURCE, REJECTIONS[case])


async def test_signed_xml_is_415() -> None:
    body, headers = signed(b"<issue/>")
    headers["content-type"] = "application/xml"
    assert_refused(await refusal_of(SOURCE, body, headers), 415, "application/xml")
