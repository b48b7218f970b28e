"""Opaque, signed keyset cursors for the admin listings: a position a client cannot forge."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from service.store.admin import Position

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
_MAC_BYTES = 16
_KEY_LABEL = b"webhook-inbox admin cursor v1"


class CursorError(ValueError):
    """A cursor that is malformed, was altered, or belongs to another query."""


def cursor_key(admin_tokens: Sequence[str]) -> bytes:
    """The signing key, derived from the admin tokens.

    Every process that shares the tokens accepts the others' cursors (several `serve` workers,
    restarts); rotating the tokens invalidates outstanding cursors, which only restarts paging.
    """
    mac = hmac.new(_KEY_LABEL, digestmod=hashlib.sha256)
    for token in sorted(admin_tokens):
        mac.update(hashlib.sha256(token.encode()).digest())
    return mac.digest()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _mac(key: bytes, scope: str, payload: bytes) -> bytes:
    return hmac.new(key, scope.encode() + b"\x00" + payload, hashlib.sha256).digest()[:_MAC_BYTES]


def encode_cursor(key: bytes, scope: str, position: Position) -> str:
    """`base64url(micros.id).base64url(mac)`, the MAC binding the position to `scope`."""
    micros = (position.received_at - _EPOCH) // _MICROSECOND
    payload = f"{micros}.{position.id}".encode()
    return f"{_b64(payload)}.{_b64(_mac(key, scope, payload))}"


def decode_cursor(key: bytes, scope: str, cursor: str) -> Position:
    """The position `cursor` names, or `CursorError` if it was not made by us for `scope`."""
    encoded_payload, dot, encoded_mac = cursor.partition(".")
    if not dot or not encoded_payload or not encoded_mac:
        raise CursorError("malformed cursor: pass next_cursor exactly as a listing returned it")
    try:
        payload = _unb64(encoded_payload)
        offered = _unb64(encoded_mac)
    except (binascii.Error, ValueError):
        raise CursorError("malformed cursor: pass next_cursor exactly as returned") from None
    if not hmac.compare_digest(offered, _mac(key, scope, payload)):
        raise CursorError(
            "cursor is invalid: altered, issued under other admin tokens, "
            "or for a listing with other filters"
        )
    try:
        micros_text, id_text = payload.decode("ascii").split(".")
        return Position(_EPOCH + int(micros_text) * _MICROSECOND, int(id_text))
    except (ValueError, OverflowError):  # pragma: no cover - only reachable with our own key
        raise CursorError("malformed cursor") from None
