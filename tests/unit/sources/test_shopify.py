"""The shopify kind on its own: base64 HMAC of the raw body, webhook id and topic from headers."""

from __future__ import annotations

import base64

import pytest

from service.core.settings import ConfigError
from service.sources.config_file import parse_inbox_config
from service.sources.shopify import shopify_signature
from tests.senders.shopify import CONFIG, OLD_SECRET, ORDER, SECRET, signed
from tests.verdicts import assert_rejection, messages_of, source_of

SOURCE = source_of(CONFIG, "shop")


def test_signature_is_base64_hmac_sha256_of_the_body() -> None:
    body, headers = signed(ORDER)
    assert shopify_signature(SECRET.encode(), body) == headers["x-shopify-hmac-sha256"]
    assert len(base64.b64decode(shopify_signature(b"k", b""))) == 32


def test_shopify_needs_a_secret() -> None:
    with pytest.raises(ConfigError, match="shopify needs at least one entry in secrets"):
        parse_inbox_config({"sources": {"s": {"kind": "shopify"}}})


async def test_rotated_secret_verifies() -> None:
    body, headers = signed(ORDER, secret=OLD_SECRET)
    (message,) = (await messages_of(SOURCE, body, headers)).items
    assert message.event_type == "orders/create"


def _tampered_body() -> tuple[bytes, dict[str, str]]:
    body, headers = signed(ORDER)
    return body.replace(b"123.45", b"0.01"), headers


def _tampered_signature() -> tuple[bytes, dict[str, str]]:
    body, headers = signed(ORDER)
    digest = bytearray(base64.b64decode(headers["x-shopify-hmac-sha256"]))
    digest[0] ^= 1
    headers["x-shopify-hmac-sha256"] = base64.b64encode(bytes(digest)).decode()
    return body, headers


def _with(name: str, value: str | None) -> tuple[bytes, dict[str, str]]:
    body, headers = signed(ORDER)
    if value is None:
        del headers[name]
    else:
        headers[name] = value
    return body, headers


REJECTIONS = {
    "tampered body": (_tampered_body, 401, "X-Shopify-Hmac-Sha256 does not match"),
    "tampered signature": (_tampered_signature, 401, "X-Shopify-Hmac-Sha256 does not match"),
    "wrong secret": (
        lambda: signed(ORDER, secret="shpss_someone_else"),
        401,
        "does not match a configured secret",
    ),
    "hex instead of base64": (
        lambda: _with("x-shopify-hmac-sha256", "ab" * 32),
        401,
        "does not match a configured secret",
    ),
    "not base64 at all": (lambda: _with("x-shopify-hmac-sha256", "sha256=ab!"), 401, "not base64"),
    "missing signature header": (
        lambda: _with("x-shopify-hmac-sha256", None),
        401,
        "missing X-Shopify-Hmac-Sha256 header",
    ),
    "missing webhook id": (lambda: signed(ORDER, webhook_id=None), 400, "X-Shopify-Webhook-Id"),
}


@pytest.mark.parametrize("case", list(REJECTIONS))
async def test_rejections_are_refused_naming_the_cause(case: str) -> None:
    await assert_rejection(SOURCE, REJECTIONS[case])
