"""What a delivery may give us to store, checked where each value is taken from it.

PostgreSQL refuses text holding NUL or an unpaired surrogate, and a b-tree entry (the
event type is indexed) over about 2.7 KB. A value that reached the database like that
would fail the whole group-commit batch it was written with, so each is refused here, with
a 4xx naming the header or field, before anything is written.
"""

from __future__ import annotations

import string
from collections.abc import Sequence

from service.sources.base import BadDelivery, Rejected

MAX_MESSAGE_ID_LENGTH = 512
MAX_EVENT_TYPE_LENGTH = 256
MAX_CONTENT_TYPE_LENGTH = 256
MAX_HEADER_COUNT = 100
MAX_HEADER_BYTES = 8192  # one header's name and value together

# RFC 9110 §5.1 and §5.5: a name is a token; a value has no control character but tab.
_TOKEN_BYTES = b"!#$%&'*+-.^_`|~" + string.digits.encode() + string.ascii_letters.encode()
_VALUE_BYTES = bytes(c for c in range(256) if c == 0x09 or 0x20 <= c != 0x7F)


def _keeping(allowed: bytes) -> bytes:
    """A `bytes.translate` table that keeps each allowed byte and changes every other one:
    `data.translate(table) == data` says `data` holds only allowed bytes. A table with nothing
    to delete is `translate`'s fast loop, with no table of deletions to build first (which cost
    more than the loop for a delivery's headers)."""
    return bytes(c if c in allowed else c ^ 1 for c in range(256))


_TOKEN_TABLE = _keeping(_TOKEN_BYTES)
_VALUE_TABLE = _keeping(_VALUE_BYTES)


def checked_header_name(name: str) -> str:
    """A configured header name, or a ValueError (the config's error, at start) unless it is
    an HTTP token (RFC 9110 §5.1): a name no request can carry would refuse every delivery.
    An empty one passes, for the fields where it means unset."""
    raw = name.encode("ascii") if name.isascii() else None
    if raw is None or raw.translate(_TOKEN_TABLE) != raw:
        raise ValueError(f"{name!r} is not an HTTP header name (a token, RFC 9110)")
    return name


class HeadersTooLarge(Rejected):
    status = 431
    reason = "headers_too_large"


def _bounded_text(text: str, limit: int, named: str) -> str:
    """`text`, or a 400 if it is longer than `limit` characters or holds a non-printable one
    (a control character, an unpaired surrogate)."""
    if len(text) > limit:
        raise BadDelivery(f"{named} is longer than {limit} characters")
    if not text.isprintable():
        bad = next(c for c in text if not c.isprintable())
        raise BadDelivery(f"{named} contains the non-printable character U+{ord(bad):04X}")
    return text


def checked_message_id(value: object, where: str) -> str:
    """A usable dedup key from `value`, or a 400 naming the header or field it came from."""
    if type(value) is str and 0 < len(value) <= MAX_MESSAGE_ID_LENGTH and value.isprintable():
        return value  # nearly every delivery's: nothing to refuse, and no refusal text made
    if value is None or value == "":
        raise BadDelivery(f"missing message id: expected {where}")
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise BadDelivery(f"message id in {where} must be a string")
    return _bounded_text(str(value), MAX_MESSAGE_ID_LENGTH, f"message id in {where}")


def checked_event_type(value: object, where: str) -> str | None:
    """The event type in `value` (None when absent or not a string), or a 400 naming `where`."""
    if type(value) is str and 0 < len(value) <= MAX_EVENT_TYPE_LENGTH and value.isprintable():
        return value  # as for message ids: no refusal text made for a usable one
    if not isinstance(value, str) or not value:
        return None
    return _bounded_text(value, MAX_EVENT_TYPE_LENGTH, f"event type in {where}")


def checked_content_type(value: str) -> str | None:
    """The request's content type as stored (None when absent), or a 400."""
    if not value:
        return None
    return _bounded_text(value, MAX_CONTENT_TYPE_LENGTH, "the Content-Type header")


def check_headers(raw: Sequence[tuple[bytes, bytes]]) -> None:
    """Refuse headers we would not store: too many (431), one too large (431), or a name or
    value an HTTP parser would have refused (400), each naming the header.

    The HTTP server already refuses most of these on the wire; this is the check for what
    reaches the app by any other way (another server, a proxy, a test client).
    """
    if len(raw) > MAX_HEADER_COUNT:
        raise HeadersTooLarge(f"{len(raw)} header fields; at most {MAX_HEADER_COUNT} are accepted")
    # Every delivery comes this way, and nearly all pass: all names at once, all values at once
    # (a forbidden byte is forbidden wherever it stands), and no header can be too large when
    # all of them together are not. Only a failure looks header by header, to name the culprit.
    # `translate` checks each in one C call, at under half a regular expression's cost.
    if not raw:
        return
    names, values = zip(*raw, strict=True)
    joined_names = b"".join(names)
    joined_values = b"".join(values)
    if (
        len(joined_names) + len(joined_values) <= MAX_HEADER_BYTES
        and b"" not in names
        and joined_names.translate(_TOKEN_TABLE) == joined_names
        and joined_values.translate(_VALUE_TABLE) == joined_values
    ):
        return
    for name, value in raw:
        shown = name[:64].decode("latin-1")
        if len(name) + len(value) > MAX_HEADER_BYTES:
            raise HeadersTooLarge(
                f"header {shown} is larger than {MAX_HEADER_BYTES} bytes (name and value)"
            )
        if not name or name.translate(_TOKEN_TABLE) != name:
            raise BadDelivery(f"header name {shown!r} is not an HTTP token")
        if value.translate(_VALUE_TABLE) != value:
            raise BadDelivery(f"header {shown} contains control characters")
