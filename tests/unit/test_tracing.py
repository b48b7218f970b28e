"""Tracing's configuration from OTEL_* variables, and the sampler that skips orphan calls."""

from __future__ import annotations

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, Decision
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags

from service.core.tracing import (
    OrphanClientSpansDropped,
    carrier_of,
    exporter_processors,
    requested_by_environment,
    service_resource,
)


@pytest.mark.parametrize(
    ("environ", "on"),
    [
        ({}, False),
        ({"OTEL_SERVICE_NAME": "inbox"}, False),  # naming a service asks for no exporter
        ({"OTEL_TRACES_EXPORTER": "otlp"}, True),
        ({"OTEL_TRACES_EXPORTER": "console"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_EXPORTER": "none"}, False),
        ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"}, False),
    ],
)
def test_tracing_is_off_unless_the_environment_asks(environ: dict[str, str], on: bool) -> None:
    assert requested_by_environment(environ) is on


def test_exporters_by_name_and_protocol() -> None:
    (otlp,) = exporter_processors({"OTEL_TRACES_EXPORTER": "otlp"})
    assert isinstance(otlp, BatchSpanProcessor)
    assert len(exporter_processors({"OTEL_TRACES_EXPORTER": "otlp,console"})) == 2
    with pytest.raises(ValueError, match="'zipkin' is not otlp, console or none"):
        exporter_processors({"OTEL_TRACES_EXPORTER": "zipkin"})
    with pytest.raises(ValueError, match="OTEL_EXPORTER_OTLP_PROTOCOL: 'http/json'"):
        exporter_processors({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"})


def test_client_calls_without_a_parent_are_not_sampled() -> None:
    sampler = OrphanClientSpansDropped(ALWAYS_ON)
    orphan = sampler.should_sample(None, 1, "SELECT", SpanKind.CLIENT)
    assert orphan.decision == Decision.DROP
    parent = NonRecordingSpan(SpanContext(1, 2, is_remote=False, trace_flags=TraceFlags(1)))
    child = sampler.should_sample(trace.set_span_in_context(parent), 1, "SELECT", SpanKind.CLIENT)
    assert child.decision == Decision.RECORD_AND_SAMPLE
    root = sampler.should_sample(None, 1, "deliver s", SpanKind.SERVER)
    assert root.decision == Decision.RECORD_AND_SAMPLE


def test_carrier_of_reads_traceparent_and_tracestate() -> None:
    assert carrier_of({"traceparent": "00-a-b-01", "tracestate": "k=v", "id": "1"}) == {
        "traceparent": "00-a-b-01",
        "tracestate": "k=v",
    }
    assert carrier_of({"traceparent": 5}) is None
    assert carrier_of({}) is None
    assert carrier_of(None) is None


def test_the_service_name_is_the_environments_else_webhook_inbox(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
    assert service_resource("http").attributes["service.name"] == "webhook-inbox"
    assert service_resource("http").attributes["process.role"] == "http"
    monkeypatch.setenv("OTEL_SERVICE_NAME", "billing-inbox")
    assert service_resource("processing").attributes["service.name"] == "billing-inbox"
    monkeypatch.delenv("OTEL_SERVICE_NAME")
    monkeypatch.setenv(
        "OTEL_RESOURCE_ATTRIBUTES", "service.name=from-attrs,deployment.environment=prod"
    )
    resource = service_resource("http")
    assert resource.attributes["service.name"] == "from-attrs"
    assert resource.attributes["deployment.environment"] == "prod"
