"""Hostile input to every kind that authenticates: the sources, how an honest sender signs, and
strategies for arbitrary headers and bodies."""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from collections.abc import Callable
from typing import Any

from hypothesis import strategies as st

from service.sources.github import github_signature
from service.sources.shopify import shopify_signature
from service.sources.slack import slack_signature
from service.sources.standard_webhooks import decode_secret, sign
from service.sources.stripe import stripe_signature_header

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


def sign_generic(body: bytes, msg_id: str) -> dict[str, str]:
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
    "generic": sign_generic,
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
