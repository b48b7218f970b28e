"""The console's signed session cookie and the CSRF token tied to it.

The cookie holds the session itself (no server-side store, so every HTTP process and restart
accepts it): a random nonce, who signed in (the fingerprint of the admin token, never the
token) and when it expires, signed with a key derived from the admin tokens. Rotating the
tokens ends every session. A visitor who has not signed in yet gets an anonymous session too,
so that the sign-in form itself carries a CSRF token.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import secrets
from collections.abc import Sequence
from dataclasses import dataclass

COOKIE = "inbox_console"
COOKIE_PATH = "/console"
SIGNED_IN_SECONDS = 8 * 3600  # a working day; then the console asks for the token again
ANONYMOUS_SECONDS = 3600  # how long a sign-in form stays valid
_KEY_LABEL = b"webhook-inbox console session v1"
_MAC_BYTES = 32


@dataclass(frozen=True)
class Session:
    nonce: str
    actor: str | None  # `token:…` once signed in; None for the sign-in form's visitor
    expires_at: int  # Unix time

    @property
    def signed_in(self) -> bool:
        return self.actor is not None


def session_key(admin_tokens: Sequence[str]) -> bytes:
    """The signing key: any process holding the same admin tokens derives the same one."""
    mac = hmac.new(_KEY_LABEL, digestmod=hashlib.sha256)
    for token in sorted(admin_tokens):
        mac.update(hashlib.sha256(token.encode()).digest())
    return mac.digest()


def new_session(actor: str | None, now: float) -> Session:
    """A fresh nonce each time: signing in never keeps the anonymous session's (or its token)."""
    lifetime = SIGNED_IN_SECONDS if actor is not None else ANONYMOUS_SECONDS
    return Session(secrets.token_urlsafe(16), actor, int(now) + lifetime)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _mac(key: bytes, label: bytes, payload: bytes) -> bytes:
    return hmac.new(key, label + b"\x00" + payload, hashlib.sha256).digest()[:_MAC_BYTES]


def encode_session(key: bytes, session: Session) -> str:
    payload = json.dumps(
        {"n": session.nonce, "a": session.actor, "e": session.expires_at}, separators=(",", ":")
    ).encode()
    return f"{_b64(payload)}.{_b64(_mac(key, b'session', payload))}"


def decode_session(key: bytes, cookie: str | None, now: float) -> Session | None:
    """The session in `cookie`, or None when it is missing, altered, malformed or expired."""
    if not cookie:
        return None
    encoded_payload, _, encoded_mac = cookie.partition(".")
    try:
        payload = _unb64(encoded_payload)
        offered = _unb64(encoded_mac)
    except (binascii.Error, ValueError):
        return None
    if not hmac.compare_digest(offered, _mac(key, b"session", payload)):
        return None
    try:
        fields = json.loads(payload)
        session = Session(str(fields["n"]), fields["a"], int(fields["e"]))
    except (ValueError, KeyError, TypeError):  # pragma: no cover - only with our own key
        return None
    return session if session.expires_at > now else None


def csrf_token(key: bytes, session: Session) -> str:
    """The token every form of this session must send back: bound to the session's nonce."""
    return _b64(_mac(key, b"csrf", session.nonce.encode()))


def csrf_matches(key: bytes, session: Session, offered: str | None) -> bool:
    if not offered:
        return False
    return hmac.compare_digest(offered.encode(), csrf_token(key, session).encode())
