"""Admin cursors round-trip and refuse forgeries."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from service.api.admin.cursor import CursorError, Position, cursor_key, decode_cursor, encode_cursor

KEY = cursor_key(["token-a", "token-b"])
POSITION = Position(datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC), 42)


def test_cursor_round_trips_to_the_microsecond() -> None:
    cursor = encode_cursor(KEY, "scope", POSITION)
    assert decode_cursor(KEY, "scope", cursor) == POSITION
    assert "42" not in cursor  # opaque: base64, not the raw position


def test_cursor_key_depends_on_the_tokens_not_their_order() -> None:
    assert cursor_key(["token-b", "token-a"]) == KEY
    assert cursor_key(["token-a"]) != KEY


@pytest.mark.parametrize(
    "mutate",
    [
        lambda c: c[:-2] + ("AA" if not c.endswith("AA") else "BB"),
        lambda c: c.split(".")[0],
        lambda c: "",
        lambda c: "." + c,
        lambda c: c.replace(".", ".."),
        lambda c: "%%%." + c.split(".")[1],
    ],
)
def test_altered_cursors_are_refused(mutate: object) -> None:
    cursor = encode_cursor(KEY, "scope", POSITION)
    with pytest.raises(CursorError):
        decode_cursor(KEY, "scope", mutate(cursor))  # type: ignore[operator]


def test_cursor_is_bound_to_its_scope_and_key() -> None:
    cursor = encode_cursor(KEY, "scope", POSITION)
    with pytest.raises(CursorError):
        decode_cursor(KEY, "other-scope", cursor)
    with pytest.raises(CursorError):
        decode_cursor(cursor_key(["token-c"]), "scope", cursor)
    forged = encode_cursor(cursor_key(["guess"]), "scope", Position(POSITION.received_at, 1))
    with pytest.raises(CursorError):
        decode_cursor(KEY, "scope", forged)
