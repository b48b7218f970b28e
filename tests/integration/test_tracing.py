"""Traces with the SDK's in-memory exporter: a delivery continues the sender's trace, its
context is stored, the attempt's span is linked to it, and the handler's INSERT is a child."""

from __future__ import annotations

import json
from collections.abc import Iterator

import asyncpg
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from service.core import tracing
from tests.conftest import AppFactory
from tests.http_server import scripted_server
from tests.processing_helpers import create_effects, delivery, source, wait_until

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
SENDER_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{SENDER_SPAN}-01"


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.enable(provider)
    try:
        yield exporter
    finally:
        tracing.disable()


def named(exporter: InMemorySpanExporter, prefix: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name.startswith(prefix)]


def hex_trace(span: ReadableSpan) -> str:
    assert span.context is not None
    return format(span.context.trace_id, "032x")


def cloudevents(**extra: object) -> dict[str, object]:
    return {
        "sources": {
            "events": {
                "kind": "cloudevents",
                "handlers": ["tests.handlers:record"],
                "max_attempts": 3,
                "backoff_base_seconds": 0.05,
                "backoff_max_seconds": 0.1,
                **extra,
            }
        }
    }


def structured_event(event_id: str, **attributes: str) -> bytes:
    event = {
        "specversion": "1.0",
        "id": event_id,
        "source": "/orders",
        "type": "order.created",
        "data": {"n": 1},
        **attributes,
    }
    return json.dumps(event).encode()


STRUCTURED = {"content-type": "application/cloudevents+json"}


async def test_a_cloudevent_traceparent_is_continued_into_the_handlers_insert(
    worker_for: AppFactory, db: asyncpg.Connection, spans: InMemorySpanExporter
) -> None:
    body = structured_event("e1", traceparent=TRACEPARENT, tracestate="vendor=1")
    async with worker_for(cloudevents()) as client:
        answer = await client.post("/webhooks/events", content=body, headers=STRUCTURED)
        assert answer.json()["status"] == "accepted"
        await wait_until(db, "SELECT status FROM inbox_messages", "processed", 10)

    (delivered,) = named(spans, "deliver events")
    assert hex_trace(delivered) == TRACE_ID
    assert delivered.parent is not None
    assert format(delivered.parent.span_id, "016x") == SENDER_SPAN
    assert delivered.attributes is not None
    assert delivered.attributes["inbox.source"] == "events"
    assert delivered.attributes["inbox.kind"] == "cloudevents"
    assert delivered.attributes["inbox.outcome"] == "accepted"
    assert delivered.attributes["messaging.message.id"] == '["/orders","e1"]'
    assert delivered.attributes["http.response.status_code"] == 200
    assert delivered.end_time is not None
    assert delivered.start_time is not None

    # The delivery span's context is what the row keeps.
    stored = json.loads(await db.fetchval("SELECT trace_context FROM inbox_messages"))
    assert delivered.context is not None
    assert stored["traceparent"] == f"00-{TRACE_ID}-{delivered.context.span_id:016x}-01"
    assert stored["tracestate"] == "vendor=1"

    (attempt,) = named(spans, "process events")
    assert [link.context.span_id for link in attempt.links] == [delivered.context.span_id]
    assert attempt.parent is not None
    assert attempt.parent.span_id == delivered.context.span_id
    assert attempt.attributes is not None
    assert attempt.attributes["inbox.attempt"] == 1
    assert attempt.attributes["inbox.outcome"] == "processed"
    assert attempt.attributes["inbox.handlers"] == ("tests.handlers:record",)

    assert attempt.context is not None
    children = [s for s in spans.get_finished_spans() if s.parent == attempt.context]
    statements = [s.name for s in children]
    assert any(name.startswith("INSERT") for name in statements), statements
    # The worker's own claims and polls, with no span above them, are not traced.
    orphans = [s.name for s in spans.get_finished_spans() if s.parent is None]
    assert orphans == [], orphans


async def test_binary_mode_header_and_a_failing_attempt(
    worker_for: AppFactory, db: asyncpg.Connection, spans: InMemorySpanExporter
) -> None:
    headers = {
        "content-type": "application/json",
        "ce-specversion": "1.0",
        "ce-id": "b1",
        "ce-source": "/orders",
        "ce-type": "order.created",
        "ce-traceparent": TRACEPARENT,
    }
    config = cloudevents(handlers=["tests.handlers:always_fail"], max_attempts=1)
    async with worker_for(config) as client:
        await client.post("/webhooks/events", content=b"{}", headers=headers)
        await wait_until(db, "SELECT status FROM inbox_messages", "dead", 10)
    (delivered,) = named(spans, "deliver events")
    assert hex_trace(delivered) == TRACE_ID
    (attempt,) = named(spans, "process events")
    assert hex_trace(attempt) == TRACE_ID
    assert attempt.attributes is not None
    assert attempt.attributes["inbox.outcome"] == "dead"
    assert "error.message" in attempt.attributes
    assert not attempt.status.is_ok


async def test_the_traceparent_header_wins_and_the_event_context_is_linked(
    client_for: AppFactory, spans: InMemorySpanExporter
) -> None:
    other = "00-11111111111111111111111111111111-2222222222222222-01"
    body = structured_event("h1", traceparent=other)
    headers = {**STRUCTURED, "traceparent": TRACEPARENT}
    async with client_for(cloudevents()) as client:
        await client.post("/webhooks/events", content=body, headers=headers)
    (delivered,) = named(spans, "deliver events")
    assert hex_trace(delivered) == TRACE_ID
    assert [format(link.context.trace_id, "032x") for link in delivered.links] == ["1" * 32]


async def test_a_rejected_delivery_is_a_span_too(
    client_for: AppFactory, spans: InMemorySpanExporter
) -> None:
    async with client_for(cloudevents()) as client:
        answer = await client.post(
            "/webhooks/events", content=b"{}", headers={**STRUCTURED, "traceparent": TRACEPARENT}
        )
    assert answer.status_code == 400
    (delivered,) = named(spans, "deliver events")
    assert hex_trace(delivered) == TRACE_ID
    assert delivered.attributes is not None
    assert delivered.attributes["inbox.outcome"] == "rejected:bad_request"
    assert delivered.attributes["inbox.kind"] == "cloudevents"
    assert delivered.attributes["http.response.status_code"] == 400


async def test_pubsub_attributes_carry_the_trace(
    client_for: AppFactory, spans: InMemorySpanExporter
) -> None:
    config = {"sources": {"topic": {"kind": "pubsub", "token": "t0k3n-value-long-enough"}}}
    envelope = {
        "message": {
            "messageId": "p1",
            "data": "e30=",
            "attributes": {"googclient_traceparent": TRACEPARENT},
        },
        "subscription": "projects/p/subscriptions/s",
    }
    async with client_for(config) as client:
        answer = await client.post(
            "/webhooks/topic?token=t0k3n-value-long-enough",
            content=json.dumps(envelope).encode(),
            headers={"content-type": "application/json"},
        )
    assert answer.status_code == 200, answer.text
    (delivered,) = named(spans, "deliver topic")
    assert hex_trace(delivered) == TRACE_ID


async def test_a_forward_carries_the_attempts_traceparent(
    worker_for: AppFactory, db: asyncpg.Connection, spans: InMemorySpanExporter
) -> None:
    async with scripted_server((200, {})) as server:
        config = {"sources": {"hooks": source(forward={"url": server.url, "timeout_seconds": 2})}}
        async with worker_for(config) as client:
            await client.post(
                "/webhooks/hooks",
                content=b"{}",
                headers={**delivery("f1"), "traceparent": TRACEPARENT},
            )
            await wait_until(db, "SELECT status FROM inbox_messages", "processed", 10)
    (request,) = server.requests
    sent = request.headers["traceparent"]
    assert sent.split("-")[1] == TRACE_ID
    (attempt,) = named(spans, "process hooks")
    http_calls = [s for s in spans.get_finished_spans() if s.parent == attempt.context]
    assert [format(s.context.span_id, "016x") for s in http_calls if s.context] == [
        sent.split("-")[2]
    ]


async def test_admin_actions_are_spans(
    worker_for: AppFactory, db: asyncpg.Connection, spans: InMemorySpanExporter
) -> None:
    config = cloudevents(handlers=["tests.handlers:always_fail"], max_attempts=1)
    async with worker_for(config, admin_tokens=["admin-token-long-enough"]) as client:
        answer = await client.post(
            "/webhooks/events", content=structured_event("a1"), headers=STRUCTURED
        )
        await wait_until(db, "SELECT status FROM inbox_messages", "dead", 10)
        auth = {"authorization": "Bearer admin-token-long-enough"}
        row_id = answer.json()["id"]
        await client.post(f"/admin/messages/{row_id}/discard", headers=auth)
        detail = (await client.get(f"/admin/messages/{row_id}", headers=auth)).json()
    (delivered,) = named(spans, "deliver events")
    assert detail["trace_id"] == hex_trace(delivered)  # to look the trace up by
    (discard,) = named(spans, "admin discard")
    assert discard.attributes is not None
    assert discard.attributes["inbox.id"] == row_id
    assert discard.attributes["inbox.admin.result"] == "discarded"
    assert discard.context is not None
    statements = [s for s in spans.get_finished_spans() if s.parent == discard.context]
    assert statements, "the admin action's SQL is its child"


async def test_with_tracing_off_a_forward_passes_the_events_own_context_on(
    worker_for: AppFactory, db: asyncpg.Connection
) -> None:
    assert not tracing.enabled()
    async with scripted_server((200, {})) as server:
        config = {
            "sources": {
                "events": {
                    "kind": "cloudevents",
                    "forward": {"url": server.url, "timeout_seconds": 2},
                }
            }
        }
        async with worker_for(config) as client:
            await client.post(
                "/webhooks/events",
                content=structured_event("off1", traceparent=TRACEPARENT),
                headers=STRUCTURED,
            )
            await wait_until(db, "SELECT status FROM inbox_messages", "processed", 10)
    (request,) = server.requests
    assert request.headers["traceparent"] == TRACEPARENT


async def test_sync_mode_attempt_is_a_child_of_the_delivery(
    client_for: AppFactory, db: asyncpg.Connection, spans: InMemorySpanExporter
) -> None:
    await create_effects(db)
    async with client_for(cloudevents(mode="sync")) as client:
        answer = await client.post(
            "/webhooks/events",
            content=structured_event("s1", traceparent=TRACEPARENT),
            headers=STRUCTURED,
        )
    assert answer.json()["status"] == "processed"
    (delivered,) = named(spans, "deliver events")
    (attempt,) = named(spans, "process events")
    assert delivered.context is not None
    assert attempt.parent is not None
    assert attempt.parent.span_id == delivered.context.span_id
    assert hex_trace(attempt) == TRACE_ID
    children = [s.name for s in spans.get_finished_spans() if s.parent == attempt.context]
    assert any(name.startswith("INSERT") for name in children), children


async def test_a_dapr_envelope_traceparent_is_continued(
    client_for: AppFactory, spans: InMemorySpanExporter
) -> None:
    config = {"sources": {"orders": {"kind": "dapr"}}}
    envelope = structured_event("d1", traceparent=TRACEPARENT, pubsubname="pubsub", topic="t")
    async with client_for(config) as client:
        answer = await client.post("/webhooks/orders", content=envelope, headers=STRUCTURED)
    assert answer.json()["status"] == "SUCCESS"
    (delivered,) = named(spans, "deliver orders")
    assert hex_trace(delivered) == TRACE_ID
    assert delivered.attributes is not None
    assert delivered.attributes["inbox.kind"] == "dapr"


async def test_an_outgoing_message_continues_the_trace_it_was_staged_in(
    worker_for: AppFactory, db: asyncpg.Connection, spans: InMemorySpanExporter
) -> None:
    async with scripted_server() as crm:
        config = {
            "sources": {"hooks": source("tests.handlers:stage_then_fail_first")},
            "endpoints": {"crm": {"url": crm.url, "timeout_seconds": 2}},
        }
        async with worker_for(config) as client:
            await client.post(
                "/webhooks/hooks",
                content=b"{}",
                headers={**delivery("o1"), "traceparent": TRACEPARENT},
            )
            sent = "SELECT status FROM inbox_messages WHERE source = 'outbox:crm'"
            await wait_until(db, sent, "processed", 10)
    (request,) = crm.requests
    assert request.headers["traceparent"].split("-")[1] == TRACE_ID
    staged_in = [s for s in named(spans, "process hooks") if s.status.is_ok]
    (relayed,) = named(spans, "process outbox:crm")
    assert relayed.parent is not None
    assert [s.context.span_id for s in staged_in if s.context] == [relayed.parent.span_id]
    assert hex_trace(relayed) == TRACE_ID
