"""What Google Pub/Sub push sends: OIDC tokens signed by a local RSA key (published to the
source as a JWKS file), and the push envelope."""

from __future__ import annotations

import base64
import functools
import json
import time
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import rsa

AUDIENCE = "https://inbox.example.com/webhooks/push"
SERVICE_ACCOUNT = "push-sa@my-project.iam.gserviceaccount.com"
TOKEN = "pubsub-token-0123456789"
KID = "test-key-1"


@functools.cache
def signing_key() -> rsa.RSAPrivateKey:
    """The key the JWKS file publishes."""
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@functools.cache
def other_key() -> rsa.RSAPrivateKey:
    """A key the source has never seen."""
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def config(directory: Path) -> dict[str, Any]:
    """`push` checks OIDC tokens against a JWKS file written in `directory`; `push-token`
    takes the query token."""
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(signing_key().public_key()))
    jwks = directory / "jwks.json"
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
