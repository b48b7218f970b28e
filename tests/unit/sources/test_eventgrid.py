"""The eventgrid kind on its own: an array refused whole for one bad event, the query token, the
key header."""

from __future__ import annotations

import json

from tests.senders.eventgrid import CONFIG, HEADERS, KEY, TOKEN, event
from tests.verdicts import assert_refused, messages_of, refusal_of, source_of

SOURCE = source_of(CONFIG, "grid")
AUTHENTIC = {"token": TOKEN}


async def test_event_without_id_rejects_the_whole_array() -> None:
    no_id = {k: v for k, v in event("x").items() if k != "id"}
    body = json.dumps([event("ok"), no_id])
    assert_refused(await refusal_of(SOURCE, body, HEADERS, AUTHENTIC), 400, "[1].id")


async def test_wrong_token_and_malformed_body() -> None:
    body = json.dumps([event("w1")])
    wrong = await refusal_of(SOURCE, body, HEADERS, {"token": "nope"})
    not_array = await refusal_of(SOURCE, json.dumps(event("w1")), HEADERS, AUTHENTIC)
    broken = await refusal_of(SOURCE, "[{", HEADERS, AUTHENTIC)
    assert wrong.status == 401
    assert not_array.status == broken.status == 400


async def test_key_header_from_a_delivery_property() -> None:
    source = source_of(CONFIG, "grid-key")
    body = json.dumps([event("k1")])
    good = await messages_of(source, body, {**HEADERS, "x-grid-key": KEY})
    wrong = await refusal_of(source, body, {**HEADERS, "x-grid-key": "other-key-987"})
    missing = await refusal_of(source, body, HEADERS)
    assert [m.message_id for m in good.items] == ["k1"]
    assert wrong.status == missing.status == 401
    assert source.is_sensitive_header("X-Grid-Key")  # stored as [redacted]
