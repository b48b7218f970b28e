"""Opaque, signed keyset cursors for the admin listings: a position a client cannot forge.

The signing is itsdangerous's (HMAC-SHA256, URL-safe base64), salted with the listing's scope
so that a cursor works only for the filters it was issued under.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from itsdangerous import BadSignature, URLSafeSerializer

from service.store.admin import Position

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
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


def _serializer(key: bytes, scope: str) -> URLSafeSerializer:
    return URLSafeSerializer(key, salt=scope, signer_kwargs={"digest_method": hashlib.sha256})


def encode_cursor(key: bytes, scope: str, position: Position) -> str:
    """The position as `[microseconds since the epoch, id]`, signed for `scope`."""
    micros = (position.received_at - _EPOCH) // _MICROSECOND
    cursor: str = _serializer(key, scope).dumps([micros, position.id])
    return cursor


def decode_cursor(key: bytes, scope: str, cursor: str) -> Position:
    """The position `cursor` names, or `CursorError` if it was not made by us for `scope`."""
    try:
        micros, row_id = _serializer(key, scope).loads(cursor)
        return Position(_EPOCH + int(micros) * _MICROSECOND, int(row_id))
    except BadSignature:
        raise CursorError(
            "cursor is invalid: altered, issued under other admin tokens, or for a listing "
            "with other filters; pass next_cursor exactly as a listing returned it"
        ) from None
    except (TypeError, ValueError, OverflowError):  # only reachable with our own key
        raise CursorError("malformed cursor") from None
