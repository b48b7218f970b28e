"""`pubsub` kind: OIDC JWTs signed by a local RSA key (JWKS file), the query token, the envelope."""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path
from typing import Any

import asyncpg
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from service.core.settings import ConfigError
from service.sources.config_file import parse_inbox_config
from tests.conftest import AppFactory

AUDIENCE = "https://inbox.example.com/webhooks/push"
SERVICE_ACCOUNT = "push-sa@my-project.iam.gserviceaccount.com"
TOKEN = "pubsub-token-0123456789"
KID = "test-key-1"


@pytest.fixture(scope="module")
def signing_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture(scope="module")
def other_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture
def config(tmp_path: Path, signing_key: rsa.RSAPrivateKey) -> dict[str, Any]:
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(signing_key.public_key()))
    jwks = tmp_path / "jwks.json"
    jwks.write_text(json.dumps({"keys": [{**jwk, "kid": KID, "alg": "RS256", "use": "sig"}]}))
    return {
        "sources": {
            "push": {
                "kind": "pubsub",
                "audience": AUDIENCE,
                "jwks_file": str(jwks),
                "service_account_email": SERVICE_ACCOUNT,
                "event_type_attribute": "eventType",
            },
            "push-token": {"kind": "pubsub", "token": TOKEN},
        }
    }


def oidc(key: rsa.RSAPrivateKey, kid: str = KID, **changes: Any) -> str:
    """A token shaped like the one Pub/Sub sends (cloud.google.com, authenticate push)."""
    now = int(time.time())
    claims: dict[str, Any] = {
        "aud": AUDIENCE,
        "azp": "113774264463038321964",
        "email": SERVICE_ACCOUNT,
        "email_verified": True,
        "exp": now + 3600,
        "iat": now,
        "iss": "https://accounts.google.com",
        "sub": "113774264463038321964",
    }
    claims.update(changes)
    claims = {k: v for k, v in claims.items() if v is not None}
    return jwt.encode(claims, key, algorithm="RS256", headers={"kid": kid})


def push_body(message_id: str = "2070443601311540", **message: Any) -> bytes:
    """A push envelope as in Google's docs, with both id spellings Pub/Sub sends."""
    body: dict[str, Any] = {
        "message": {
            "attributes": {"eventType": "order.created"},
            "data": base64.b64encode(b'{"order": 1}').decode(),
            "messageId": message_id,
            "message_id": message_id,
            "publishTime": "2021-02-26T19:13:55.749Z",
            "publish_time": "2021-02-26T19:13:55.749Z",
            **message,
        },
        "subscription": "projects/myproject/subscriptions/mysubscription",
    }
    return json.dumps(body).encode()


def bearer(token: str) -> dict[str, str]:
    return {"content-type": "application/json", "authorization": f"Bearer {token}"}


async def count(db: asyncpg.Connection) -> int:
    return int(await db.fetchval("SELECT count(*) FROM inbox_messages"))


async def test_oidc_push_is_accepted_then_duplicate(
    client_for: AppFactory,
    db: asyncpg.Connection,
    config: dict[str, Any],
    signing_key: rsa.RSAPrivateKey,
) -> None:
    headers = bearer(oidc(signing_key))
    async with client_for(config) as client:
        first = await client.post("/webhooks/push", content=push_body(), headers=headers)
        again = await client.post("/webhooks/push", content=push_body(), headers=headers)
    assert first.status_code == 200, first.text
    assert first.json()["message_id"] == "2070443601311540"
    assert again.json() == {"status": "duplicate", "message_id": "2070443601311540"}
    row = await db.fetchrow("SELECT event_type, headers FROM inbox_messages")
    assert row is not None
    assert row["event_type"] == "order.created"
    assert json.loads(row["headers"])["authorization"] == "[redacted]"


async def test_the_unprefixed_issuer_is_accepted(
    client_for: AppFactory,
    db: asyncpg.Connection,
    config: dict[str, Any],
    signing_key: rsa.RSAPrivateKey,
) -> None:
    headers = bearer(oidc(signing_key, iss="accounts.google.com"))
    async with client_for(config) as client:
        response = await client.post("/webhooks/push", content=push_body(), headers=headers)
    assert response.json()["status"] == "accepted"


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
    client_for: AppFactory,
    db: asyncpg.Connection,
    config: dict[str, Any],
    signing_key: rsa.RSAPrivateKey,
    changes: dict[str, Any],
    detail_part: str,
) -> None:
    headers = bearer(oidc(signing_key, **changes))
    async with client_for(config) as client:
        response = await client.post("/webhooks/push", content=push_body(), headers=headers)
    assert response.status_code == 401
    assert detail_part in response.json()["detail"]
    assert await count(db) == 0


async def test_wrong_key_unknown_kid_tampered_and_missing_token_are_401(
    client_for: AppFactory,
    db: asyncpg.Connection,
    config: dict[str, Any],
    signing_key: rsa.RSAPrivateKey,
    other_key: rsa.RSAPrivateKey,
) -> None:
    good = oidc(signing_key)
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
    async with client_for(config) as client:
        responses = [
            await client.post("/webhooks/push", content=push_body(), headers=headers)
            for headers in (
                bearer(oidc(other_key)),
                bearer(oidc(signing_key, kid="unknown")),
                bearer(f"{header}.{forged_payload.decode()}.{signature}"),
                bearer(hs256),
                bearer("not-a-jwt"),
                {"content-type": "application/json"},
            )
        ]
    assert [r.status_code for r in responses] == [401] * 6
    assert await count(db) == 0


async def test_query_token(client_for: AppFactory, db: asyncpg.Connection, config: Any) -> None:
    headers = {"content-type": "application/json"}
    async with client_for(config) as client:
        good = await client.post(
            f"/webhooks/push-token?token={TOKEN}", content=push_body(), headers=headers
        )
        wrong = await client.post(
            "/webhooks/push-token?token=nope", content=push_body("2"), headers=headers
        )
    assert good.json()["status"] == "accepted"
    assert good.json()["message_id"] == "2070443601311540"
    assert wrong.status_code == 401
    assert await count(db) == 1


async def test_missing_message_id_and_malformed_envelope_are_400(
    client_for: AppFactory, db: asyncpg.Connection, config: Any
) -> None:
    headers = {"content-type": "application/json"}
    url = f"/webhooks/push-token?token={TOKEN}"
    async with client_for(config) as client:
        no_id = await client.post(
            url, content=push_body(messageId=None, message_id=None), headers=headers
        )
        no_message = await client.post(url, content=b'{"subscription": "s"}', headers=headers)
        broken = await client.post(url, content=b'{"message": ', headers=headers)
    assert no_id.status_code == no_message.status_code == broken.status_code == 400
    assert "message.messageId" in no_id.json()["detail"]
    assert await count(db) == 0


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
