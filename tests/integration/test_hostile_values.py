"""Property tests over the values every kind stores: event types, headers, content types.

Authentic deliveries of every kind (tests/deliveries.py) carrying arbitrary text where the
event type goes, and arbitrary extra headers, through the app and group commit into the real
database: each is stored exactly as sent, or refused with a 4xx naming the field (Dapr
answers 200 DROP instead), and never a 5xx (issue 11 item 1).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

import asyncpg
import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.sources.base import BadDelivery, parse_json
from service.sources.limits import (
    MAX_CONTENT_TYPE_LENGTH,
    MAX_EVENT_TYPE_LENGTH,
    MAX_HEADER_BYTES,
    MAX_HEADER_COUNT,
)
from tests.deliveries import FROM_HEADER, KINDS, TOKEN, delivery, refusal, stored_message_id

# `type` is a required CloudEvents attribute: an empty one is missing.
TYPE_REQUIRED = {"cloudevents-binary", "cloudevents-structured", "dapr"}
FUZZ = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def fuzzed_for_each(
    kinds: list[str], **strategies: st.SearchStrategy[Any]
) -> Callable[[Callable[..., Any]], Any]:
    """A property test run for each of `kinds` (its `kind` argument), on FUZZ's examples of
    `strategies` each."""

    def decorate(test: Callable[..., Any]) -> Any:
        return pytest.mark.parametrize("kind", kinds)(FUZZ(given(**strategies)(test)))

    return decorate


# Any text for body-borne event types: controls, unpaired surrogates, anything at all, and
# lengths on both sides of the limit. Header-borne ones travel as Latin-1 bytes.


def texts(min_size: int = 0, max_size: int = 40) -> st.SearchStrategy[str]:
    """Any text, unpaired surrogates included: a JSON `\\ud800` escape carries one, but
    Hypothesis's `text()` never draws one."""
    surrogate = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF, exclude_categories=[])
    return st.text(min_size=min_size, max_size=max_size) | st.lists(
        st.characters() | surrogate, min_size=min_size, max_size=max_size
    ).map("".join)


any_text = texts() | texts(MAX_EVENT_TYPE_LENGTH - 2, MAX_EVENT_TYPE_LENGTH + 2)
latin1_text = st.text(alphabet=st.characters(max_codepoint=255), max_size=40) | st.text(
    alphabet=st.characters(min_codepoint=32, max_codepoint=126),
    min_size=MAX_EVENT_TYPE_LENGTH - 2,
    max_size=MAX_EVENT_TYPE_LENGTH + 2,
)
extreme = st.sampled_from(["\x00", "a\x00b", "\ud800", "x" * 8_000, "é" * MAX_EVENT_TYPE_LENGTH])


async def send(
    client: httpx.AsyncClient, kind: str, event_type: str, extra: dict[bytes, bytes] | None = None
) -> tuple[str, httpx.Response]:
    msg_id = uuid.uuid4().hex
    built = delivery(kind, msg_id, event_type)
    headers = list(built.headers.items()) + list((extra or {}).items())
    response = await client.post(built.path, content=built.body, headers=headers)
    assert response.status_code < 500, (kind, response.status_code, response.text)
    return msg_id, response


async def stored(db: asyncpg.Connection, kind: str, msg_id: str) -> asyncpg.Record | None:
    return await db.fetchrow(
        "SELECT event_type, headers, content_type FROM inbox_messages WHERE message_id = $1",
        stored_message_id(kind, msg_id),
    )


def as_received(kind: str, event_type: str) -> str | None:
    """The event type as the service reads it back from what `delivery` sent, None if it
    cannot: a JSON escape pairs adjacent surrogates up, and percent-encoded UTF-8 (the
    CloudEvents binary mode) cannot hold a surrogate at all."""
    if kind in FROM_HEADER:
        return event_type
    if kind == "cloudevents-binary":
        return None if any(0xD800 <= ord(c) <= 0xDFFF for c in event_type) else event_type
    return str(json.loads(json.dumps(event_type)))


@fuzzed_for_each(KINDS, data=st.data())
async def test_any_event_type_is_stored_as_sent_or_refused_naming_it(
    every_kind: httpx.AsyncClient, db: asyncpg.Connection, kind: str, data: st.DataObject
) -> None:
    event_type = data.draw((latin1_text if kind in FROM_HEADER else any_text) | extreme)
    if kind in FROM_HEADER:
        event_type = event_type.encode("latin-1", "replace").decode("latin-1")
    msg_id, response = await send(every_kind, kind, event_type)
    seen = as_received(kind, event_type)
    storable = (
        seen is not None
        and len(seen) <= MAX_EVENT_TYPE_LENGTH
        and seen.isprintable()
        and (bool(seen) or kind not in TYPE_REQUIRED)
    )
    detail = refusal(kind, response)
    row = await stored(db, kind, msg_id)
    if storable:
        assert detail is None, (event_type, detail)
        assert row is not None
        assert row["event_type"] == (seen or None)
    else:
        assert detail is not None, (event_type, response.text)
        assert row is None
        # Named as the event type, or as the header or attribute it came in.
        assert "event type" in detail or "header" in detail or "'type'" in detail, detail


header_names = st.text(
    alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_.~!#$%&'*+^`|", min_size=1, max_size=12
).map(lambda n: f"x-fuzz-{n}".encode())
odd_names = st.sampled_from([b"x fuzz", b"x-fuzz:", b"x-fuzz\x00", b"x-fuzz(", b"x-fuzz\x7f"])
header_values = (
    st.binary(max_size=40)
    | st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=255), max_size=40).map(
        lambda v: v.encode("latin-1")
    )
    | st.integers(MAX_HEADER_BYTES - 30, MAX_HEADER_BYTES + 10).map(lambda n: b"v" * n)
)
extra_headers = st.dictionaries(header_names | odd_names, header_values, max_size=8) | st.integers(
    MAX_HEADER_COUNT - 16, MAX_HEADER_COUNT + 4
).map(lambda n: {f"x-fuzz-{i}".encode(): b"1" for i in range(n)})


TOKEN_CHARS = frozenset(b"abcdefghijklmnopqrstuvwxyz0123456789-_.~!#$%&'*+^`|")


def expected_refusal(own: int, extra: dict[bytes, bytes]) -> int | None:
    """431 or 400 for `extra` added to `own` headers, None when the delivery is fine."""
    if own + len(extra) > MAX_HEADER_COUNT:
        return 431
    for name, value in extra.items():
        if len(name) + len(value) > MAX_HEADER_BYTES:
            return 431
        legal_name = set(name) <= TOKEN_CHARS
        legal_value = not any((c < 32 and c != 9) or c == 127 for c in value)
        if not (legal_name and legal_value):
            return 400
    return None


async def own_header_count(client: httpx.AsyncClient, db: asyncpg.Connection, kind: str) -> int:
    """How many headers the app sees in a delivery of `kind` (the client adds a few)."""
    msg_id, response = await send(client, kind, "t")
    assert response.status_code == 200, response.text
    row = await stored(db, kind, msg_id)
    assert row is not None
    return len(json.loads(row["headers"]))


@fuzzed_for_each(KINDS, data=st.data())
async def test_any_headers_are_stored_or_refused_naming_them(
    every_kind: httpx.AsyncClient, db: asyncpg.Connection, kind: str, data: st.DataObject
) -> None:
    own = await own_header_count(every_kind, db, kind)
    extra = data.draw(extra_headers)
    msg_id, response = await send(every_kind, kind, "order.created", extra)
    expected = expected_refusal(own, extra)
    row = await stored(db, kind, msg_id)
    if expected is None:
        assert response.status_code == 200, response.text
        assert refusal(kind, response) is None, response.text
        assert row is not None
        headers: dict[str, Any] = json.loads(row["headers"])
        for name, value in extra.items():
            text = name.decode("latin-1")
            # A name that says it holds a credential is stored redacted, whatever its value.
            sensitive = any(word in text for word in ("token", "secret", "signature"))
            assert headers[text] == ("[redacted]" if sensitive else value.decode("latin-1"))
    else:
        detail = refusal(kind, response)
        assert detail is not None, response.text
        assert "header" in detail
        # Dapr's on_malformed = "drop" answers a malformed delivery 200 DROP instead of 400.
        dropped = kind == "dapr" and expected == 400
        assert response.status_code == (200 if dropped else expected), response.text
        assert row is None


@fuzzed_for_each(
    KINDS, content_type=st.text(alphabet=st.characters(max_codepoint=255), max_size=300)
)
async def test_any_content_type_is_never_a_5xx_and_is_stored_as_sent(
    every_kind: httpx.AsyncClient, db: asyncpg.Connection, kind: str, content_type: str
) -> None:
    msg_id = uuid.uuid4().hex
    built = delivery(kind, msg_id, "t")
    built.headers["content-type"] = content_type.encode("latin-1")
    response = await every_kind.post(built.path, content=built.body, headers=built.headers)
    assert response.status_code < 500, response.text
    detail = refusal(kind, response)
    row = await stored(db, kind, msg_id)
    if len(content_type) > MAX_CONTENT_TYPE_LENGTH or not content_type.isprintable():
        assert detail is not None, response.text
        assert row is None
    elif detail is None:  # else a kind that cannot read this media type: 415 (or DROP)
        assert row is not None
        # Event Grid stores each event of its array as the JSON it is.
        assert row["content_type"] in (content_type or None, "application/json")


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | texts(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(texts(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


@fuzzed_for_each(["eventgrid", "cloudevents-batch"], data=json_values)
async def test_any_event_data_in_a_batch_is_stored_as_json_equal_to_it(
    every_kind: httpx.AsyncClient, db: asyncpg.Connection, kind: str, data: Any
) -> None:
    # A batch's events are each stored as their own JSON, re-encoded from the parsed array.
    msg_id = uuid.uuid4().hex
    if kind == "eventgrid":
        body = json.dumps([{"id": msg_id, "eventType": "t", "data": data}])
        path, media = f"/webhooks/eventgrid?token={TOKEN}", "application/json"
    else:
        event = {"specversion": "1.0", "id": msg_id, "source": "/tests", "type": "t"}
        body = json.dumps([{**event, "data": data}])
        path = f"/webhooks/cloudevents-structured?token={TOKEN}"
        media = "application/cloudevents-batch+json"
    response = await every_kind.post(path, content=body, headers={"content-type": media})
    try:  # as the service reads it: a JSON escape pairs adjacent surrogates up
        received = parse_json(json.dumps(data).encode())
    except BadDelivery:  # which can make two keys one
        assert response.status_code == 400, response.text
        return
    assert response.status_code == 200, response.text
    message_id = msg_id if kind == "eventgrid" else stored_message_id("cloudevents", msg_id)
    body_sql = "SELECT body FROM inbox_messages WHERE message_id = $1"
    assert json.loads(await db.fetchval(body_sql, message_id))["data"] == received
