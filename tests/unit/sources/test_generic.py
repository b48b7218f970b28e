"""The generic kind's credentials on their own: a shared token, basic auth, a body HMAC with
any algorithm and encoding."""

from __future__ import annotations

import base64
import hashlib
import hmac
from typing import Any

import pytest
from starlette.datastructures import Headers

from service.sources.base import Messages, RawDelivery, Unauthenticated
from tests.verdicts import messages_of, refusal_of, source_of

SECRET = "test-secret-0123456789"


def basic(user: str, password: str) -> dict[str, str]:
    """The Authorization header of HTTP basic auth, as a client library sends it."""
    return {"authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


async def test_generic_token_in_query_or_bearer() -> None:
    config = {"sources": {"s": {"kind": "generic", "id_header": "x-id", "token": "tok-abc-123"}}}
    source = source_of(config, "s")
    missing = await refusal_of(source, b"a", {"x-id": "1"})
    wrong = await refusal_of(source, b"a", {"x-id": "1"}, {"token": "nope"})
    query = await messages_of(source, b"a", {"x-id": "1"}, {"token": "tok-abc-123"})
    bearer = await messages_of(source, b"a", {"x-id": "2", "authorization": "Bearer tok-abc-123"})
    assert missing.status == 401
    assert wrong.status == 401
    assert [m.message_id for m in query.items + bearer.items] == ["1", "2"]


async def test_generic_basic_auth() -> None:
    config = {"sources": {"s": {"kind": "generic", "id_header": "x-id", "basic_auth": "u:p4ss"}}}
    source = source_of(config, "s")
    good = await messages_of(source, b"a", {"x-id": "1", **basic("u", "p4ss")})
    bad = await refusal_of(source, b"a", {"x-id": "2", **basic("u", "no")})
    assert [m.message_id for m in good.items] == ["1"]
    assert bad.status == 401


@pytest.mark.parametrize(
    ("algorithm", "encoding", "digest"),
    [("sha1", "hex", hashlib.sha1), ("sha512", "base64", hashlib.sha512)],
)
async def test_generic_hmac_algorithms_and_encodings(
    algorithm: str, encoding: str, digest: Any
) -> None:
    config = {
        "sources": {
            "s": {
                "kind": "generic",
                "id_header": "x-id",
                "secrets": ["old-secret-value", SECRET],
                "hmac": {"header": "x-hub", "algorithm": algorithm, "encoding": encoding},
            }
        }
    }
    source = source_of(config, "s")
    mac = hmac.new(SECRET.encode(), b"data", digest).digest()
    sig = mac.hex() if encoding == "hex" else base64.b64encode(mac).decode()
    ok = await messages_of(source, b"data", {"x-id": "1", "x-hub": sig})
    tampered = await refusal_of(source, b"datb", {"x-id": "2", "x-hub": sig})
    assert [m.message_id for m in ok.items] == ["1"]
    assert tampered.status == 401


@pytest.mark.parametrize(
    ("id_from", "where"),
    [
        ({"id_header": "x-id"}, "the x-id header"),
        ({"id_json_pointer": "/id"}, "the JSON field /id"),
        ({"id_header": "x-id", "id_json_pointer": "/id"}, "the x-id header or the JSON field /id"),
    ],
)
async def test_a_missing_or_unusable_message_id_is_refused_naming_where_it_was_looked_for(
    id_from: dict[str, str], where: str
) -> None:
    source = source_of({"sources": {"s": {"kind": "generic", **id_from}}}, "s")
    missing = await refusal_of(source, b"{}", {"content-type": "application/json"})
    not_text = await refusal_of(source, b'{"id": [1]}', {"content-type": "application/json"})
    unprintable = await refusal_of(source, b'{"id": "a\\u0007"}', {"x-id": "b\x7f"})
    too_long = await refusal_of(source, b'{"id": "%s"}' % (b"i" * 513), {"x-id": "j" * 513})
    assert (missing.status, missing.detail) == (400, f"missing message id: expected {where}")
    if "id_json_pointer" in id_from:
        assert not_text.detail == f"message id in {where} must be a string"
    assert unprintable.detail.startswith(f"message id in {where} contains the non-printable")
    assert too_long.detail == f"message id in {where} is longer than 512 characters"
    # Within the limit and printable, a header's id or a JSON field's is the message id as sent.
    kept = await messages_of(source, b'{"id": "%s"}' % (b"i" * 512), {"x-id": "i" * 512})
    assert [m.message_id for m in kept.items] == ["i" * 512]


async def test_the_id_and_event_type_headers_are_read_at_their_first_value_in_any_case() -> None:
    config = {"kind": "generic", "id_header": "X-Message-ID", "event_type_header": "X-Event"}
    source = source_of({"sources": {"s": config}}, "s")
    raw = [
        (b"x-event", b"order.created"),
        (b"x-message-id", b"first"),
        (b"x-message-id", b"second"),
        (b"x-event", b"order.deleted"),
    ]
    delivery = RawDelivery("POST", {}, b"{}", raw)
    verdict = await source.authenticate(delivery)
    assert isinstance(verdict, Messages)
    assert [(m.message_id, m.event_type) for m in verdict.items] == [("first", "order.created")]
    # As `Headers.get` reads them: the same first values.
    assert (Headers(raw=raw).get("x-message-id"), Headers(raw=raw).get("x-event")) == (
        "first",
        "order.created",
    )


async def test_the_hmac_header_is_read_in_any_case_at_its_first_value_after_its_prefix() -> None:
    hmac_table = {"header": "X-Hub-Signature", "prefix": "sha256="}
    config = {"kind": "generic", "id_header": "x-id", "secrets": [SECRET], "hmac": hmac_table}
    source = source_of({"sources": {"s": config}}, "s")
    good = "sha256=" + hmac.new(SECRET.encode(), b"data", hashlib.sha256).hexdigest().upper()
    raw = [(b"x-id", b"1"), (b"x-hub-signature", good.encode()), (b"x-hub-signature", b"sha256=")]
    verdict = await source.authenticate(RawDelivery("POST", {}, b"data", raw))
    assert isinstance(verdict, Messages)
    missing = await refusal_of(source, b"data", {"x-id": "2"})
    unprefixed = await refusal_of(source, b"data", {"x-id": "3", "x-hub-signature": good[7:]})
    wrong = b"sha256=" + b"0" * 64
    second = [(b"x-id", b"4"), (b"x-hub-signature", wrong), (b"x-hub-signature", good.encode())]
    with pytest.raises(Unauthenticated, match="X-Hub-Signature does not match"):
        await source.authenticate(RawDelivery("POST", {}, b"data", second))
    assert (missing.status, missing.detail) == (401, "missing X-Hub-Signature header")
    assert unprefixed.detail == "X-Hub-Signature does not start with 'sha256='"
