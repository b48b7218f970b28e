"""The cloudevents kind on its own, handed requests the official SDK builds: binary and
structured modes, required attributes, a token, an HMAC."""

from __future__ import annotations

import json

import pytest
from cloudevents.core.bindings.http import to_binary_event, to_structured_event
from cloudevents.core.formats.json import JSONFormat

from service.sources.cloudevents_http import dedup_key
from tests.senders.cloudevents import CONFIG, event, sign
from tests.verdicts import assert_refused, messages_of, refusal_of, source_of

SOURCE = source_of(CONFIG, "ce")


def test_dedup_key_is_unambiguous() -> None:
    assert dedup_key('/x","y', "z") != dedup_key("/x", 'y","z')
    assert json.loads(dedup_key("/a b%", "é")) == ["/a b%", "é"]


async def test_percent_encoded_binary_headers_are_decoded() -> None:
    message = to_binary_event(event("id 1", source='/a b%"é'))
    assert "%20" in message.headers["ce-source"]
    (only,) = (await messages_of(SOURCE, message.body, message.headers)).items
    assert json.loads(only.message_id) == ['/a b%"é', "id 1"]


async def test_a_binary_header_not_percent_encoded_utf8_is_400_naming_it() -> None:
    message = to_binary_event(event("id 1"))
    refusal = await refusal_of(SOURCE, message.body, {**message.headers, "ce-source": "/a%ff"})
    assert_refused(refusal, 400, "header ce-source is not percent-encoded UTF-8")


async def test_a_bad_event_in_a_batch_refuses_all_of_it() -> None:
    good = json.loads(JSONFormat().write(event("ok")))
    bad = {k: v for k, v in good.items() if k != "source"}
    body = json.dumps([good, bad]).encode()
    headers = {"content-type": "application/cloudevents-batch+json"}
    refusal = await refusal_of(SOURCE, body, headers)
    assert_refused(refusal, 400, "'source'")
    assert "batch[1]" in refusal.detail


@pytest.mark.parametrize("missing", ["specversion", "id", "source", "type"])
async def test_missing_required_attribute_is_400_naming_it(missing: str) -> None:
    structured = json.loads(to_structured_event(event()).body)
    del structured[missing]
    binary = to_binary_event(event())
    headers = {k: v for k, v in binary.headers.items() if k != f"ce-{missing}"}
    s = await refusal_of(
        SOURCE,
        json.dumps(structured).encode(),
        {"content-type": "application/cloudevents+json"},
    )
    b = await refusal_of(SOURCE, binary.body, headers)
    for refusal in (s, b):
        assert_refused(refusal, 400, repr(missing))


async def test_malformed_structured_json_and_other_formats() -> None:
    broken = await refusal_of(SOURCE, b'{"id": ', {"content-type": "application/cloudevents+json"})
    avro = await refusal_of(SOURCE, b"\x00", {"content-type": "application/cloudevents+avro"})
    assert broken.status == 400
    assert avro.status == 415


async def test_token_is_required_as_bearer_or_query() -> None:
    source = source_of(CONFIG, "ce-token")
    message = to_binary_event(event("t1"))
    none = await refusal_of(source, message.body, message.headers)
    wrong = await refusal_of(
        source, message.body, {**message.headers, "authorization": "Bearer nope"}
    )
    bearer = await messages_of(
        source,
        message.body,
        {**message.headers, "authorization": "Bearer ce-token-0123456789"},
    )
    assert none.status == wrong.status == 401
    assert [m.message_id for m in bearer.items] == ['["/orders","t1"]']


async def test_hmac_over_the_raw_body() -> None:
    source = source_of(CONFIG, "ce-hmac")
    message = to_structured_event(event("h1"))
    tampered = message.body.replace(b'"h1"', b'"h2"')
    good = await messages_of(
        source, message.body, {**message.headers, "x-signature": sign(message.body)}
    )
    body_changed = await refusal_of(
        source, tampered, {**message.headers, "x-signature": sign(message.body)}
    )
    wrong_key = await refusal_of(
        source,
        message.body,
        {**message.headers, "x-signature": sign(message.body, "other-secret-98765")},
    )
    assert [m.message_id for m in good.items] == ['["/orders","h1"]']
    assert body_changed.status == wrong_key.status == 401
