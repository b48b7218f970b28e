"""The slack kind on its own: Slack's documented example, secrets, timestamps, every refusal."""

from __future__ import annotations

import time

import pytest

from service.core.settings import ConfigError
from service.sources import signing
from service.sources.config_file import parse_inbox_config
from service.sources.slack import slack_signature
from tests.senders.slack import (
    CONFIG,
    DOC_BODY,
    DOC_SECRET,
    DOC_SIGNATURE,
    DOC_TIMESTAMP,
    OLD_SECRET,
    SECRET,
    callback,
    signed,
)
from tests.verdicts import assert_refused, assert_rejection, messages_of, refusal_of, source_of

SOURCE = source_of(CONFIG, "slack")
DOC_SOURCE = source_of({"sources": {"slack": {"kind": "slack", "secrets": [DOC_SECRET]}}}, "slack")


def test_documented_example() -> None:
    assert slack_signature(DOC_SECRET.encode(), DOC_TIMESTAMP, DOC_BODY) == DOC_SIGNATURE


def test_slack_needs_a_secret() -> None:
    with pytest.raises(ConfigError, match="slack needs at least one entry in secrets"):
        parse_inbox_config({"sources": {"s": {"kind": "slack"}}})


async def test_documented_example_verifies_at_its_own_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(signing, "now", lambda: float(DOC_TIMESTAMP))
    headers = {
        "content-type": "application/x-www-form-urlencoded",
        "x-slack-request-timestamp": DOC_TIMESTAMP,
        "x-slack-signature": DOC_SIGNATURE,
    }
    good = await refusal_of(DOC_SOURCE, DOC_BODY, headers)
    bad = await refusal_of(DOC_SOURCE, DOC_BODY + b"-", headers)
    # Authentic, but a slash command (a form without event_id) is not an Events API callback.
    assert_refused(good, 415, "Events API")
    assert_refused(bad, 401, "X-Slack-Signature does not match")


async def test_documented_example_is_stale_today() -> None:
    headers = {"x-slack-request-timestamp": DOC_TIMESTAMP, "x-slack-signature": DOC_SIGNATURE}
    assert_refused(await refusal_of(DOC_SOURCE, DOC_BODY, headers), 401, "too old")


async def test_rotated_secret_verifies() -> None:
    body = callback("Ev0OLD")
    (message,) = (await messages_of(SOURCE, body, signed(body, secret=OLD_SECRET)[1])).items
    assert message.message_id == "Ev0OLD"


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
async def test_rejections_are_refused_naming_the_cause(case: str) -> None:
    await assert_rejection(SOURCE, REJECTIONS[case])


async def test_tolerance_is_configurable() -> None:
    config = {"sources": {"s": {"kind": "slack", "secrets": [SECRET], "tolerance_seconds": 900}}}
    body, late = signed(callback("EvLate"), timestamp=int(time.time()) - 600)
    (message,) = (await messages_of(source_of(config, "s"), body, late)).items
    assert message.message_id == "EvLate"
    assert_refused(await refusal_of(SOURCE, body, late), 401, "too old")
