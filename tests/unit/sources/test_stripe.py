"""The stripe kind on its own, against stripe-python's own signing helpers."""

from __future__ import annotations

import json
import time

import pytest
import stripe

from service.core.settings import ConfigError
from service.sources.config_file import parse_inbox_config
from service.sources.stripe import (
    parse_signature_header,
    stripe_signature,
    stripe_signature_header,
)
from tests.senders.stripe import (
    CONFIG,
    OLD_SECRET,
    SDK_PAYLOAD,
    SECRET,
    event,
    generate_header,
    headers,
)
from tests.verdicts import assert_refused, messages_of, refusal_of, source_of

SOURCE = source_of(CONFIG, "payments")

# -- the signing function, against the SDK --------------------------------------------------


def test_signature_matches_stripe_python() -> None:
    ours = stripe_signature(SECRET.encode(), 1_700_000_000, SDK_PAYLOAD.encode())
    theirs = stripe.WebhookSignature._compute_signature(f"1700000000.{SDK_PAYLOAD}", SECRET)
    assert ours == theirs


def test_header_is_what_stripe_python_generates_and_verifies() -> None:
    header = stripe_signature_header(SECRET.encode(), 1_700_000_000, SDK_PAYLOAD.encode())
    assert header == stripe.WebhookSignature.generate_signature_header(
        SDK_PAYLOAD, SECRET, timestamp=1_700_000_000
    )
    assert stripe.WebhookSignature.verify_header(SDK_PAYLOAD, header, SECRET)


def test_header_parsing_keeps_every_v1_and_ignores_other_schemes() -> None:
    assert parse_signature_header("t=12,v1=aa,v0=bb,v1=cc") == (12, ["aa", "cc"])
    with pytest.raises(ValueError, match="no t= element"):
        parse_signature_header("v1=aa")
    with pytest.raises(ValueError, match="invalid literal"):
        parse_signature_header("t=soon,v1=aa")


def test_stripe_needs_a_secret() -> None:
    with pytest.raises(ConfigError, match="stripe needs at least one entry in secrets"):
        parse_inbox_config({"sources": {"p": {"kind": "stripe"}}})


# -- the source, handed what the SDK signs ---------------------------------------------------


async def test_sdk_payload_signed_by_the_sdk_is_accepted() -> None:
    header = stripe.WebhookSignature.generate_signature_header(SDK_PAYLOAD, SECRET)
    (message,) = (await messages_of(SOURCE, SDK_PAYLOAD, headers(header))).items
    assert message.message_id == "evt_test_webhook"
    assert message.body is None  # the request body is the message, stored as sent
    assert message.event_type is None  # that payload has no type
    assert SOURCE.is_sensitive_header("Stripe-Signature")  # stored as [redacted]


async def test_rotated_secret_and_extra_signatures() -> None:
    body_old, body_new = event("evt_old"), event("evt_new")
    # During rotation Stripe signs with both secrets: one header, two v1 entries.
    both = (
        generate_header(body_new)
        + ",v1="
        + stripe_signature(OLD_SECRET.encode(), int(time.time()), body_new.encode())
    )
    old = await messages_of(SOURCE, body_old, headers(generate_header(body_old, secret=OLD_SECRET)))
    new = await messages_of(SOURCE, body_new, headers(both))
    assert [m.message_id for m in old.items + new.items] == ["evt_old", "evt_new"]


def _tampered_body() -> tuple[str, str]:
    return event("evt_x").replace("charge", "chargf"), generate_header(event("evt_x"))


def _tampered_signature() -> tuple[str, str]:
    body = event("evt_x")
    header = generate_header(body)
    return body, header[:-1] + ("0" if header[-1] != "0" else "1")


REJECTIONS = {
    "tampered body": (_tampered_body, 401, "no Stripe-Signature v1 signature matches"),
    "tampered signature": (_tampered_signature, 401, "no Stripe-Signature v1 signature matches"),
    "wrong secret": (
        lambda: (event(), generate_header(event(), secret="whsec_someone_else")),
        401,
        "matches a configured secret",
    ),
    "stale timestamp": (
        lambda: (event(), generate_header(event(), timestamp=int(time.time()) - 301)),
        401,
        "too old",
    ),
    "future timestamp": (
        lambda: (event(), generate_header(event(), timestamp=int(time.time()) + 360)),
        401,
        "in the future",
    ),
    "only a v0 signature": (
        lambda: (event(), generate_header(event(), scheme="v0")),
        401,
        "has no v1 signature",
    ),
    "malformed header": (lambda: (event(), "i'm not a signature header"), 401, "malformed"),
    "missing event id": (
        lambda: (json.dumps({"type": "t"}), generate_header(json.dumps({"type": "t"}))),
        400,
        "JSON field id",
    ),
    "malformed JSON": (lambda: ('{"id": ', generate_header('{"id": ')), 400, "not valid JSON"),
}


@pytest.mark.parametrize("case", list(REJECTIONS))
async def test_rejections_are_refused_naming_the_cause(case: str) -> None:
    build, status, detail = REJECTIONS[case]
    body, header = build()
    assert_refused(await refusal_of(SOURCE, body, headers(header)), status, detail)


async def test_missing_signature_header_is_401_naming_it() -> None:
    refusal = await refusal_of(SOURCE, event(), {"content-type": "application/json"})
    assert_refused(refusal, 401, "missing Stripe-Signature header")


async def test_signed_non_json_is_415() -> None:
    body = event()
    signed = {"content-type": "text/plain", "stripe-signature": generate_header(body)}
    assert_refused(await refusal_of(SOURCE, body, signed), 415, "text/plain")


async def test_tolerance_is_configurable() -> None:
    config = {"sources": {"p": {"kind": "stripe", "secrets": [SECRET], "tolerance_seconds": 900}}}
    body = event("evt_late")
    late = headers(generate_header(body, timestamp=int(time.time()) - 600))
    (message,) = (await messages_of(source_of(config, "p"), body, late)).items
    assert message.message_id == "evt_late"
