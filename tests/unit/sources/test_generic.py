"""The generic kind's credentials on their own: a shared token, basic auth, a body HMAC with
any algorithm and encoding."""

from __future__ import annotations

import base64
import hashlib
import hmac
from typing import Any

import pytest

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
