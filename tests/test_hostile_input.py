"""Hostile input: arbitrary headers and bodies never crash a verifier nor pass as authentic."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from collections.abc import Callable
from typing import Any

import asyncpg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.datastructures import Headers

from service.sources.base import Messages, RawDelivery, Rejected, Source, Unauthenticated
from service.sources.config_file import parse_inbox_config
from service.sources.github import github_signature
from service.sources.shopify import shopify_signature
from service.sources.slack import slack_signature
from service.sources.standard_webhooks import decode_secret, sign
from service.sources.stripe import stripe_signature_header
from tests.conftest import AppFactory

SECRET = "whsec_" + base64.b64encode(b"hostile-input-test-key-material!").decode()
KEY = SECRET.encode()

# Every source that authenticates, each with how an honest sender signs a body.
SIGNED_SOURCES: dict[str, dict[str, Any]] = {
    "generic": {
        "kind": "generic",
        "secrets": [SECRET],
        "id_header": "x-id",
        "hmac": {"header": "x-sig", "prefix": "sha256="},
    },
    "standard-webhooks": {"kind": "standard-webhooks", "secrets": [SECRET]},
    "stripe": {"kind": "stripe", "secrets": [SECRET]},
    "github": {"kind": "github", "secrets": [SECRET]},
    "shopify": {"kind": "shopify", "secrets": [SECRET]},
    "slack": {"kind": "slack", "secrets": [SECRET]},
    "token": {"kind": "generic", "id_header": "x-id", "token": "a-long-shared-token-value"},
    "basic": {"kind": "generic", "id_header": "x-id", "basic_auth": "user:a-long-password"},
    "pubsub": {"kind": "pubsub", "token": "a-long-shared-token-value"},
    "eventgrid": {"kind": "eventgrid", "token": "a-long-shared-token-value"},
    "cloudevents": {"kind": "cloudevents", "token": "a-long-shared-token-value"},
    "cloudevents-hmac": {
        "kind": "cloudevents",
        "secrets": [SECRET],
        "hmac": {"header": "x-sig", "prefix": "sha256="},
    },
    "dapr": {"kind": "dapr", "app_api_token": "a-long-shared-token-value"},
    # SNS carries its signature inside the JSON body, so garbage is refused as malformed (400)
    # or unauthenticated (401); a certificate is never fetched for it (the URL rule comes first).
    "sns": {"kind": "sns", "topic_arns": ["*"]},
}
# Kinds that must parse the body to find the signature: garbage may be a 400 instead of a 401.
SIGNATURE_IN_BODY = {"sns"}


def _sign_generic(body: bytes, msg_id: str) -> dict[str, str]:
    sig = hmac.new(KEY, body, hashlib.sha256).hexdigest()
    return {"x-sig": f"sha256={sig}", "x-id": msg_id}


def _sign_standard(body: bytes, msg_id: str) -> dict[str, str]:
    now = int(time.time())
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(now),
        "webhook-signature": sign(decode_secret(SECRET), msg_id, now, body),
    }


SIGNERS: dict[str, Callable[[bytes, str], dict[str, str]]] = {
    "generic": _sign_generic,
    "standard-webhooks": _sign_standard,
    "stripe": lambda body, _: {
        "stripe-signature": stripe_signature_header(KEY, int(time.time()), body)
    },
    "github": lambda body, msg_id: {
        "x-hub-signature-256": github_signature(KEY, body),
        "x-github-delivery": msg_id,
        "x-github-event": "push",
    },
    "shopify": lambda body, msg_id: {
        "x-shopify-hmac-sha256": shopify_signature(KEY, body),
        "x-shopify-webhook-id": msg_id,
        "x-shopify-topic": "orders/create",
    },
    "slack": lambda body, _: {
        "x-slack-request-timestamp": str(int(time.time())),
        "x-slack-signature": slack_signature(KEY, str(int(time.time())), body),
    },
}

SOURCES: dict[str, Source] = dict(parse_inbox_config({"sources": SIGNED_SOURCES}).sources)

header_names = st.sampled_from(
    [
        "content-type",
        "authorization",
        "x-sig",
        "x-id",
        "webhook-id",
        "webhook-timestamp",
        "webhook-signature",
        "stripe-signature",
        "x-hub-signature-256",
        "x-github-delivery",
        "x-github-event",
        "x-shopify-hmac-sha256",
        "x-shopify-webhook-id",
        "x-slack-signature",
        "x-slack-request-timestamp",
        "dapr-api-token",
        "ce-id",
        "ce-source",
        "ce-type",
        "ce-specversion",
        "aeg-event-type",
        "x-amz-sns-message-type",
    ]
)
header_values = st.text(
    alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=120
) | st.sampled_from(["", "v1,", "t=1,v1=", "sha256=", "v0=", "Bearer ", "Basic !!", "0"])
bodies = st.binary(max_size=512) | st.sampled_from(
    [b"{}", b"[]", b'{"id": 1}', b'{"type": "url_verification", "challenge": "x"}', b"\xff\xfe"]
)


def delivery(
    headers: dict[str, str], body: bytes, query: dict[str, str] | None = None
) -> RawDelivery:
    raw = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
    return RawDelivery("POST", Headers(raw=raw), query or {}, body)


@pytest.mark.parametrize("name", sorted(SIGNED_SOURCES))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(headers=st.dictionaries(header_names, header_values, max_size=8), body=bodies)
async def test_arbitrary_requests_are_refused_as_unauthenticated(
    name: str, headers: dict[str, str], body: bytes
) -> None:
    with pytest.raises(Rejected) as info:
        await SOURCES[name].authenticate(delivery(headers, body))
    if name not in SIGNATURE_IN_BODY:
        assert isinstance(info.value, Unauthenticated), info.value.detail


@pytest.mark.parametrize("name", sorted(SIGNERS))
@settings(max_examples=100, deadline=None)
@given(
    body=bodies
    | st.dictionaries(st.text(max_size=8), st.text(max_size=8)).map(
        lambda d: json.dumps(d).encode()
    ),
    msg_id=st.text(
        min_size=1, max_size=40, alphabet=st.characters(min_codepoint=33, max_codepoint=126)
    ),
    flip=st.integers(min_value=0, max_value=10_000),
)
async def test_signed_bodies_verify_and_any_altered_byte_does_not(
    name: str, body: bytes, msg_id: str, flip: int
) -> None:
    headers = {"content-type": "application/json", **SIGNERS[name](body, msg_id)}
    source = SOURCES[name]
    refusal: Rejected | None = None
    try:
        verdict = await source.authenticate(delivery(headers, body))
    except Rejected as exc:
        refusal = exc
    if refusal is None:
        assert isinstance(verdict, Messages) or name == "slack"
    else:
        # Authentic but unusable (no id, not JSON, wrong media type): never a 401.
        assert not isinstance(refusal, Unauthenticated), refusal.detail

    if body:
        altered = bytearray(body)
        altered[flip % len(body)] ^= 0x01
        with pytest.raises(Unauthenticated):
            await source.authenticate(delivery(headers, bytes(altered)))


def _signed(body: bytes, msg_id: str = "hostile") -> dict[str, str]:
    headers = _sign_generic(body, msg_id)
    headers["content-type"] = "application/json"
    return headers


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        (b'{"id": "a\xff"}', "not valid UTF-8"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (b'{"id": "a", "id": "b"}', "duplicate key"),
        (json.dumps({"id": "x" * 513}).encode(), "longer than 512"),
        (json.dumps({"id": "a\nb"}).encode(), "non-printable character U+000A"),
        (json.dumps({"id": ["a"]}).encode(), "must be a string"),
        (json.dumps({"id": True}).encode(), "must be a string"),
        (b"", "not valid JSON"),
    ],
)
async def test_hostile_signed_bodies_get_a_clear_4xx(
    client_for: AppFactory, db: asyncpg.Connection, body: bytes, detail: str
) -> None:
    config = {
        "sources": {
            "g": {
                "kind": "generic",
                "secrets": [SECRET],
                "id_json_pointer": "/id",
                "hmac": {"header": "x-sig", "prefix": "sha256="},
            }
        }
    }
    async with client_for(config) as client:
        response = await client.post("/webhooks/g", content=body, headers=_signed(body))
    assert response.status_code == 400, response.text
    assert detail in response.json()["detail"]
    assert await db.fetchval("SELECT count(*) FROM inbox_messages") == 0


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    path=st.sampled_from(sorted(SIGNED_SOURCES)),
    headers=st.dictionaries(header_names, header_values, max_size=6),
    body=bodies,
    query=st.dictionaries(st.sampled_from(["token", "x"]), st.text(max_size=20), max_size=2),
)
async def test_ingest_never_answers_5xx_nor_records_unauthenticated_input(
    client_for: AppFactory,
    db: asyncpg.Connection,
    path: str,
    headers: dict[str, str],
    body: bytes,
    query: dict[str, str],
) -> None:
    async with client_for({"sources": SIGNED_SOURCES}) as client:
        response = await client.post(
            f"/webhooks/{path}", content=body, headers=headers, params=query
        )
    expected = {400, 401, 415} if path in SIGNATURE_IN_BODY else {401}
    assert response.status_code in expected, response.text
    assert response.headers["content-type"] == "application/problem+json"
    assert await db.fetchval("SELECT count(*) FROM inbox_messages") == 0
