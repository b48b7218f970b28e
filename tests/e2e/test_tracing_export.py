"""`serve` with OTEL_EXPORTER_OTLP_ENDPOINT: its HTTP and processing processes export their spans
over OTLP/HTTP to a real local server, and the attempt continues the sender's trace."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import asyncpg
import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from tests.http_server import ScriptedServer, scripted_server
from tests.processing_helpers import create_effects, wait_until
from tests.server import ServerProcess, serve_env
from tests.worker_process import wait_listening

pytestmark = pytest.mark.slow

TOML = """
[sources.events]
kind = "cloudevents"
handlers = ["tests.handlers:record"]
"""

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


def exported(collector: ScriptedServer) -> list[tuple[str, Span]]:
    """Every span received so far, with the `process.role` of the process that sent it."""
    spans = []
    for request in collector.requests:
        batch = ExportTraceServiceRequest.FromString(request.body)
        for resource_spans in batch.resource_spans:
            attributes = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
            for scope in resource_spans.scope_spans:
                spans += [(attributes.get("process.role", ""), span) for span in scope.spans]
    return spans


async def test_serve_exports_delivery_and_attempt_spans_over_otlp(
    database_url: str, db: asyncpg.Connection, tmp_path: Path
) -> None:
    await create_effects(db)
    async with scripted_server() as collector:
        env = serve_env(
            tmp_path,
            TOML,
            DATABASE_URL=database_url,
            OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{collector.port}",
            OTEL_SERVICE_NAME="inbox-under-test",
            OTEL_BSP_SCHEDULE_DELAY="100",
        )
        with ServerProcess(env, tmp_path, startup_timeout=60) as server:
            await wait_listening(db, 1)
            event = {"specversion": "1.0", "id": "x1", "source": "/s", "type": "t"}
            async with httpx.AsyncClient() as client:
                answer = await client.post(
                    f"{server.url}/webhooks/events",
                    content=json.dumps({**event, "traceparent": TRACEPARENT}).encode(),
                    headers={"content-type": "application/cloudevents+json"},
                )
            assert answer.status_code == 200, answer.text
            await wait_until(db, "SELECT status FROM inbox_messages", "processed", 20)
            for _ in range(100):
                names = {span.name for _, span in exported(collector)}
                if {"deliver events", "process events"} <= names:
                    break
                await asyncio.sleep(0.1)
            # Stopped while the collector can still answer the processes' last flush.
            await asyncio.to_thread(server.terminate)
    spans = exported(collector)
    (delivered,) = [(role, s) for role, s in spans if s.name == "deliver events"]
    (attempt,) = [(role, s) for role, s in spans if s.name == "process events"]
    assert delivered[0] == "http"
    assert attempt[0] == "processing"
    assert delivered[1].trace_id.hex() == TRACE_ID
    assert attempt[1].trace_id.hex() == TRACE_ID
    assert attempt[1].parent_span_id == delivered[1].span_id
    assert [link.span_id for link in attempt[1].links] == [delivered[1].span_id]
    statements = [s.name for _, s in spans if s.parent_span_id == attempt[1].span_id]
    assert any(name.startswith("INSERT") for name in statements), statements
