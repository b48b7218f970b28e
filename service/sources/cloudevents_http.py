"""CloudEvents over HTTP for `cloudevents`, `dapr` and `eventgrid`: modes, dedup key, OPTIONS."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import unquote

from service.core.tracing import carrier_of
from service.sources.base import (
    BadDelivery,
    Handshake,
    Message,
    Messages,
    RawDelivery,
    Rejected,
    UnsupportedMediaType,
    first_header,
    parse_json,
    raw_header_name,
)
from service.sources.limits import checked_event_type, checked_message_id

STRUCTURED = "application/cloudevents+json"
BATCH = "application/cloudevents-batch+json"
REQUIRED_ATTRIBUTES = ("specversion", "id", "source", "type")
SPEC_VERSIONS = frozenset({"1.0", "0.3"})
CE_HEADER_PREFIX = "ce-"
_RAW_CE_PREFIX = raw_header_name(CE_HEADER_PREFIX)


class OriginNotAllowed(Rejected):
    status = 403
    reason = "origin_not_allowed"


def dedup_key(source: str, event_id: str) -> str:
    """The message id of an event: `source` and `id` as a two-element JSON array.

    The spec makes only the pair unique ("Consumers MAY assume that Events with identical
    source and id are duplicates"), and a JSON array cannot be read two ways, whatever
    either part contains: `["/orders","A-1"]` is never `["/orders\\",\\"A","1"]`.
    """
    return json.dumps([source, event_id], ensure_ascii=False, separators=(",", ":"))


def _attribute(event: Mapping[str, Any], name: str, where: str) -> str:
    value = event.get(name)
    if value is None or value == "":
        raise BadDelivery(f"missing CloudEvents attribute {name!r}: expected {where}")
    if not isinstance(value, str):
        raise BadDelivery(f"CloudEvents attribute {name!r} in {where} must be a string")
    return value


def message_from_attributes(
    event: Mapping[str, Any], where: str, body: bytes | None = None
) -> Message:
    """Check the required attributes of one event and name its message (400 naming what lacks)."""
    for name in REQUIRED_ATTRIBUTES:
        _attribute(event, name, where)
    if event["specversion"] not in SPEC_VERSIONS:
        raise BadDelivery(
            f"CloudEvents specversion {event['specversion']!r} in {where} is not 1.0 or 0.3"
        )
    source = checked_message_id(event["source"], f"the 'source' attribute in {where}")
    event_id = checked_message_id(event["id"], f"the 'id' attribute in {where}")
    message_id = checked_message_id(dedup_key(source, event_id), f"'source' + 'id' in {where}")
    content_type = STRUCTURED if body is not None else None
    event_type = checked_event_type(event["type"], f"the 'type' attribute in {where}")
    # The distributed-tracing extension: `traceparent`/`tracestate` attributes (`ce-traceparent`
    # headers in binary mode, members of the event in structured and batched modes).
    return Message(
        message_id,
        event_type,
        body=body,
        content_type=content_type,
        trace_context=carrier_of(event),
    )


def binary_attributes(delivery: RawDelivery) -> dict[str, str]:
    """The `ce-*` headers of a binary-mode request, percent-decoded as the HTTP binding says;
    one sent twice is read at its first value, as every header is."""
    attributes: dict[str, str] = {}
    for raw_name, raw_value in delivery.raw_headers:
        if raw_name.startswith(_RAW_CE_PREFIX):
            name = raw_name.decode("latin-1")
            attribute = name[len(CE_HEADER_PREFIX) :]
            if attribute in attributes:
                continue
            try:
                attributes[attribute] = unquote(raw_value.decode("latin-1"), errors="strict")
            except UnicodeDecodeError:
                raise BadDelivery(f"header {name} is not percent-encoded UTF-8") from None
    return attributes


def serialized(event: Any) -> bytes:
    """One batch member's own bytes, as a structured-mode body would carry it."""
    try:
        return json.dumps(event, ensure_ascii=False, separators=(",", ":")).encode()
    except UnicodeEncodeError:
        # An unpaired surrogate, which the sender could only send as a `\ud800` escape:
        # UTF-8 cannot carry it, so it stays an escape (with the rest of the non-ASCII).
        return json.dumps(event, separators=(",", ":")).encode()


def structured_event(delivery: RawDelivery) -> Messages:
    event = parse_json(delivery.body)
    if not isinstance(event, dict):
        raise BadDelivery("a structured-mode CloudEvent is a JSON object")
    return Messages([message_from_attributes(event, "the body")])


def batched_events(delivery: RawDelivery) -> Messages:
    events = parse_json(delivery.body)
    if not isinstance(events, list):
        raise BadDelivery("a batched-mode body is a JSON array of CloudEvents")
    messages = []
    for index, event in enumerate(events):
        where = f"batch[{index}]"
        if not isinstance(event, dict):
            raise BadDelivery(f"{where} is not a JSON object")
        messages.append(message_from_attributes(event, where, body=serialized(event)))
    return Messages(messages, batch=True)


def read_events(delivery: RawDelivery, *, binary: bool = True, batch: bool = True) -> Messages:
    """Name the events of an (already authenticated) CloudEvents HTTP request, by its mode.

    The mode comes from the content type, as the HTTP protocol binding (§3) defines it:
    `application/cloudevents-batch` batched, `application/cloudevents` structured, any other
    binary (attributes in `ce-*` headers, the body is the event's data).
    """
    media = delivery.media_type
    if media.startswith("application/cloudevents-batch"):
        if not batch or media != BATCH:
            raise UnsupportedMediaType(f"content type {media!r}: this source reads {STRUCTURED}")
        return batched_events(delivery)
    if media.startswith("application/cloudevents"):
        if media != STRUCTURED:
            raise UnsupportedMediaType(f"content type {media!r}: only the JSON event format")
        return structured_event(delivery)
    if not binary:
        raise UnsupportedMediaType(f"content type {media!r}: this source reads {STRUCTURED}")
    attributes = binary_attributes(delivery)
    message = message_from_attributes(
        attributes, "the ce-" + "/ce-".join(REQUIRED_ATTRIBUTES) + " headers"
    )
    return Messages([message])


def abuse_protection(
    delivery: RawDelivery, allowed_origins: Sequence[str], allowed_rate: str | None
) -> Handshake | None:
    """The CloudEvents webhook validation answer (HTTP webhook spec §4.2), or None for 405.

    The request names its sender in `WebHook-Request-Origin`; an approved one is answered 200
    with `WebHook-Allowed-Origin` (that origin) and `WebHook-Allowed-Rate`. `allowed_origins`
    `["*"]` approves any origin; an origin not listed is refused with 403.
    """
    origin = first_header(delivery.raw_headers, b"webhook-request-origin")
    if not origin:
        return None
    if "*" not in allowed_origins and origin.lower() not in {o.lower() for o in allowed_origins}:
        raise OriginNotAllowed(f"WebHook-Request-Origin {origin!r} is not in allowed_origins")
    headers = {"WebHook-Allowed-Origin": origin, "Allow": "POST, OPTIONS"}
    # The spec says MUST when the sender asked for a rate, SHOULD otherwise.
    headers["WebHook-Allowed-Rate"] = allowed_rate or "*"
    return Handshake(status=200, body=b"", headers=headers)
