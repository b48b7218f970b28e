"""The pubsub kind on its own: OIDC tokens checked against a JWKS file, the query token, the
push envelope, and the configurations refused at start."""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path
from typing import Any

import jwt
import pytest

from service.core.settings import ConfigError
from service.sources.base import AnySource
from service.sources.config_file import parse_inbox_config
from tests.senders.pubsub import (
    AUDIENCE,
    KID,
    TOKEN,
    bearer,
    config,
    oidc,
    other_key,
    push_body,
    signing_key,
)
from tests.verdicts import messages_of, refusal_of, source_of

JSON = {"content-type": "application/json"}


@pytest.fixture
def push(tmp_path: Path) -> AnySource:
    return source_of(config(tmp_path), "push")


async def test_the_unprefixed_issuer_is_accepted(push: AnySource) -> None:
    headers = bearer(oidc(signing_key(), iss="accounts.google.com"))
    (message,) = (await messages_of(push, push_body(), headers)).items
    assert message.message_id == "2070443601311540"


@pytest.mark.parametrize(
    ("changes", "detail_part"),
    [
        ({"aud": "https://elsewhere.example.com/"}, "audience"),
        ({"exp": int(time.time()) - 3600, "iat": int(time.time()) - 7200}, "expired"),
        ({"iss": "https://evil.example.com"}, "issuer"),
        ({"email": "someone@evil.example.com"}, "service account"),
        ({"email_verified": False}, "service account"),
        ({"exp": None}, "exp"),
    ],
)
async def test_bad_claims_are_401(
    push: AnySource, changes: dict[str, Any], detail_part: str
) -> None:
    refusal = await refusal_of(push, push_body(), bearer(oidc(signing_key(), **changes)))
    assert refusal.status == 401
    assert detail_part in refusal.detail


async def test_wrong_key_unknown_kid_tampered_and_missing_token_are_401(push: AnySource) -> None:
    good = oidc(signing_key())
    header, _payload, signature = good.split(".")
    forged_payload = base64.urlsafe_b64encode(
        json.dumps({**jwt.decode(good, options={"verify_signature": False}), "aud": "x"}).encode()
    ).rstrip(b"=")
    hs256 = jwt.encode(
        {"aud": AUDIENCE},
        "shared-secret-long-enough-for-hs256!",
        algorithm="HS256",
        headers={"kid": KID},
    )
    refusals = [
        await refusal_of(push, push_body(), headers)
        for headers in (
            bearer(oidc(other_key())),
            bearer(oidc(signing_key(), kid="unknown")),
            bearer(f"{header}.{forged_payload.decode()}.{signature}"),
            bearer(hs256),
            bearer("not-a-jwt"),
            JSON,
        )
    ]
    assert [r.status for r in refusals] == [401] * 6


async def test_query_token(tmp_path: Path) -> None:
    source = source_of(config(tmp_path), "push-token")
    good = await messages_of(source, push_body(), JSON, {"token": TOKEN})
    wrong = await refusal_of(source, push_body("2"), JSON, {"token": "nope"})
    assert [m.message_id for m in good.items] == ["2070443601311540"]
    assert wrong.status == 401


async def test_missing_message_id_and_malformed_envelope_are_400(tmp_path: Path) -> None:
    source = source_of(config(tmp_path), "push-token")
    query = {"token": TOKEN}
    no_id = await refusal_of(source, push_body(messageId=None, message_id=None), JSON, query)
    no_message = await refusal_of(source, b'{"subscription": "s"}', JSON, query)
    broken = await refusal_of(source, b'{"message": ', JSON, query)
    assert no_id.status == no_message.status == broken.status == 400
    assert "message.messageId" in no_id.detail


def test_a_pubsub_source_without_auth_is_refused_at_start() -> None:
    with pytest.raises(ConfigError, match="allow_unauthenticated"):
        parse_inbox_config({"sources": {"p": {"kind": "pubsub"}}})
    parsed = parse_inbox_config(
        {"sources": {"p": {"kind": "pubsub", "allow_unauthenticated": True}}}
    )
    assert parsed.sources["p"].kind == "pubsub"


def test_an_unreadable_jwks_file_is_refused_at_start(tmp_path: Path) -> None:
    bad = tmp_path / "jwks.json"
    bad.write_text("{}")
    with pytest.raises(ConfigError, match="jwks_file"):
        parse_inbox_config(
            {"sources": {"p": {"kind": "pubsub", "audience": AUDIENCE, "jwks_file": str(bad)}}}
        )
