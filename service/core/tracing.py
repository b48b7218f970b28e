"""OpenTelemetry traces: off unless the standard OTEL_* variables ask for them.

Off, every hook below is one check of a module global and creates nothing. On, a delivery
gets a span that continues the sender's trace, its context is stored with each message, each
processing attempt gets a span that is a child of, and linked to, that stored context, and the
handlers' own SQLAlchemy and httpx calls become children of the attempt's span.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode, Tracer
from opentelemetry.util.types import Attributes, AttributeValue

if TYPE_CHECKING:  # the sources use this module too, and need no SQLAlchemy
    from sqlalchemy.ext.asyncio import AsyncEngine


class Traceable(Protocol):
    """A message as `service.sources.base.Message` is: a dataclass carrying a trace context."""

    @property
    def trace_context(self) -> Mapping[str, str] | None: ...


MessageT = TypeVar("MessageT", bound=Traceable)

log = logging.getLogger("service.tracing")

TRACER_NAME = "webhook-inbox"
MAX_MESSAGE_IDS = 100
DEFAULT_SERVICE_NAME = "webhook-inbox"

# A trace context as W3C Trace Context writes it: {"traceparent": ..., "tracestate": ...}.
Carrier = Mapping[str, str]

# The tracer while tracing is on; None is off, and every hook tests only this.
_tracer: Tracer | None = None
_provider: TracerProvider | None = None
_instrumented: list[Any] = []


def enabled() -> bool:
    return _tracer is not None


# Setting up ---------------------------------------------------------------------------------


def requested_by_environment(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether OTEL_* variables ask for traces: an exporter or an OTLP endpoint is named.

    OTEL_SDK_DISABLED=true and OTEL_TRACES_EXPORTER=none win over everything else.
    """
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter == "none":
        return False
    return bool(
        exporter
        or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )


def exporter_processors(environ: Mapping[str, str] = os.environ) -> list[SpanProcessor]:
    """Batch processors for the exporters OTEL_TRACES_EXPORTER names (default `otlp`)."""
    names = [n.strip().lower() for n in environ.get("OTEL_TRACES_EXPORTER", "otlp").split(",")]
    processors: list[SpanProcessor] = []
    for name in filter(None, names):
        if name == "console":
            processors.append(BatchSpanProcessor(ConsoleSpanExporter()))
        elif name == "otlp":
            processors.append(BatchSpanProcessor(otlp_exporter(environ)))
        else:
            raise ValueError(f"OTEL_TRACES_EXPORTER: {name!r} is not otlp, console or none")
    return processors


def otlp_exporter(environ: Mapping[str, str]) -> Any:
    """The OTLP exporter for OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL; it reads its own endpoint,
    headers and timeout from the OTEL_EXPORTER_OTLP_* variables."""
    protocol = (
        environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/protobuf"
    )
    if protocol == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter()
    if protocol == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (  # type: ignore[import-not-found]
                OTLPSpanExporter as GrpcExporter,
            )
        except ImportError:
            raise ValueError(
                "OTEL_EXPORTER_OTLP_PROTOCOL=grpc needs the package "
                "opentelemetry-exporter-otlp-proto-grpc installed; http/protobuf needs nothing"
            ) from None
        return GrpcExporter()
    raise ValueError(f"OTEL_EXPORTER_OTLP_PROTOCOL: {protocol!r} is not http/protobuf or grpc")


class OrphanClientSpansDropped(Sampler):
    """The configured sampler, except that a database or HTTP client call with no span above
    it (the worker's own claims and polls, every two seconds) is not traced at all."""

    def __init__(self, inner: Sampler) -> None:
        self.inner = inner

    def should_sample(
        self,
        parent_context: Context | None,
        trace_id: int,
        name: str,
        kind: SpanKind | None = None,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        trace_state: trace.TraceState | None = None,
    ) -> SamplingResult:
        parent = trace.get_current_span(parent_context).get_span_context()
        if kind == SpanKind.CLIENT and not parent.is_valid:
            return SamplingResult(Decision.DROP)
        return self.inner.should_sample(
            parent_context, trace_id, name, kind, attributes, links, trace_state
        )

    def get_description(self) -> str:
        return f"OrphanClientSpansDropped{{{self.inner.get_description()}}}"


def service_resource(role: str) -> Resource:
    """OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES, with `webhook-inbox` as the service
    name when neither gives one, and the process's role (`http`, `processing`)."""
    resource = Resource.create({"process.role": role})
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": DEFAULT_SERVICE_NAME}))
    return resource


def configure_from_environment(role: str) -> bool:
    """Turn tracing on in this process if OTEL_* asks for it; whether it is on.

    The provider reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES (resource), and
    OTEL_TRACES_SAMPLER(_ARG) (sampler); it becomes the global one, so a handler's own spans
    land in the same traces.
    """
    if not requested_by_environment():
        return False
    provider = TracerProvider(resource=service_resource(role))
    for processor in exporter_processors():
        provider.add_span_processor(processor)
    enable(provider, set_global=True)
    log.info(
        "tracing on",
        extra={"sampler": provider.sampler.get_description(), "role": role},
    )
    return True


def enable(provider: TracerProvider, *, set_global: bool = False) -> None:
    """Trace into `provider` from now on: engines created from now on, and every httpx client."""
    global _tracer, _provider
    from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor

    provider.sampler = OrphanClientSpansDropped(provider.sampler)
    if set_global:
        trace.set_tracer_provider(provider)
    _provider = provider
    _tracer = provider.get_tracer(TRACER_NAME)
    instrumentor = HTTPXClientInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    _instrumented.append(instrumentor)


def disable() -> None:
    """Tracing off again (for tests); engines already instrumented keep their listeners."""
    global _tracer, _provider
    for instrumentor in _instrumented:
        instrumentor.uninstrument()
    _instrumented.clear()
    _tracer = None
    _provider = None


def instrument_engine(engine: AsyncEngine) -> None:
    """With tracing on, every statement on `engine` under a span becomes a child span."""
    if _provider is None:
        return
    from opentelemetry.instrumentation.sqlalchemy.engine import EngineTracer
    from opentelemetry.metrics import get_meter

    tracer = _provider.get_tracer("opentelemetry.instrumentation.sqlalchemy")
    usage = get_meter(TRACER_NAME).create_up_down_counter("db.client.connections.usage")
    EngineTracer(tracer, engine.sync_engine, usage)  # type: ignore[no-untyped-call]


# Trace context as data ---------------------------------------------------------------------


def carrier_of(values: Mapping[str, Any] | None) -> dict[str, str] | None:
    """The W3C trace context in `values` (headers, CloudEvents attributes, Pub/Sub attributes),
    or None; `prefix`-less names only, as the CloudEvents extension spells them."""
    if not values:
        return None
    parent = values.get("traceparent")
    if not isinstance(parent, str) or not parent:
        return None
    carrier = {"traceparent": parent}
    state = values.get("tracestate")
    if isinstance(state, str) and state:
        carrier["tracestate"] = state
    return carrier


def current_carrier() -> dict[str, str] | None:
    """The current span's W3C trace context as data, for work another process continues later
    (an outgoing message staged in a handler's attempt, or in an application's own traced
    request); None when no span is current."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier_of(carrier)


def _context_of(carrier: Carrier | None) -> Context | None:
    if not carrier:
        return None
    context = propagate.extract(carrier)
    span_context = trace.get_current_span(context).get_span_context()
    return context if span_context.is_valid else None


def _link_to(carrier: Carrier | None) -> Link | None:
    context = _context_of(carrier)
    if context is None:
        return None
    return Link(trace.get_current_span(context).get_span_context())


# Deliveries --------------------------------------------------------------------------------


@dataclass(eq=False)
class DeliveryTrace:
    """One delivery's span, started once its messages are known (backdated to the request's
    start) so that it can continue the trace the messages themselves carry."""

    tracer: Tracer
    source: str
    # The request's headers as the server parsed them: (lowercase name, value).
    raw_headers: list[tuple[bytes, bytes]]
    kind: str = ""
    status_code: int | None = None
    start_ns: int = field(default_factory=time.time_ns)
    span: Span | None = None
    outcomes: list[str] = field(default_factory=list)
    message_ids: list[str] = field(default_factory=list)

    def start(self, carried: Sequence[Carrier | None] = ()) -> Span:
        """Start the span: the child of the request's `traceparent`, else of the first
        context a message carries; linked to every other context the messages carry."""
        if self.span is not None:
            return self.span
        # Imported when a span starts: the worker imports this module too, and needs no Starlette.
        from starlette.datastructures import Headers

        parent = _context_of(carrier_of(Headers(raw=self.raw_headers)))
        links: list[Link] = []
        for carrier in carried:
            if parent is None:
                parent = _context_of(carrier)
                continue
            link = _link_to(carrier)
            if (
                link is not None
                and link.context != trace.get_current_span(parent).get_span_context()
            ):
                links.append(link)
        self.span = self.tracer.start_span(
            f"deliver {self.source}",
            context=parent,
            kind=SpanKind.SERVER,
            attributes={"inbox.source": self.source},
            links=links,
            start_time=self.start_ns,
        )
        return self.span

    def carrier(self) -> dict[str, str]:
        carrier: dict[str, str] = {}
        propagate.inject(carrier, context=trace.set_span_in_context(self.start()))
        return carrier

    def outcome(self, message_id: str | None, outcome: str) -> None:
        self.outcomes.append(outcome)
        if message_id is not None:
            self.message_ids.append(message_id)

    def end(self) -> None:
        span = self.start()
        if self.kind:
            span.set_attribute("inbox.kind", self.kind)
        status_code = self.status_code
        if self.message_ids:
            span.set_attribute("messaging.message.id", self.message_ids[0])
            # A batch may hold thousands; the first ones find the trace, the count says the rest.
            span.set_attribute("inbox.message_ids", self.message_ids[:MAX_MESSAGE_IDS])
        if self.outcomes:
            span.set_attribute("inbox.outcome", ",".join(sorted(set(self.outcomes))))
        span.set_attribute("inbox.messages", len(self.message_ids))
        if status_code is not None:
            span.set_attribute("http.response.status_code", status_code)
            if status_code >= 500:
                span.set_status(Status(StatusCode.ERROR))
        span.set_attribute("inbox.duration_ms", round((time.time_ns() - self.start_ns) / 1e6, 3))
        span.end()


# The delivery the current request is receiving, for the hooks deeper in ingest.
_delivery: ContextVar[DeliveryTrace | None] = ContextVar("inbox_delivery_trace", default=None)


# What `delivery_span` returns with tracing off: one shared object, so that the ingest path
# allocates nothing for tracing.
_OFF: AbstractContextManager[None] = nullcontext(None)


def delivery_span(
    source: str, raw_headers: list[tuple[bytes, bytes]]
) -> AbstractContextManager[DeliveryTrace | None]:
    """Trace the delivery received in this block; yields None (and makes nothing) when off.

    The caller sets `status_code` on what it yields; the span ends with the block.
    """
    if _tracer is None:
        return _OFF
    return _delivery_span(_tracer, source, raw_headers)


@contextmanager
def _delivery_span(
    tracer: Tracer, source: str, raw_headers: list[tuple[bytes, bytes]]
) -> Iterator[DeliveryTrace]:
    delivery = DeliveryTrace(tracer, source, raw_headers)
    token = _delivery.set(delivery)
    try:
        yield delivery
    finally:
        _delivery.reset(token)
        delivery.end()


def traced_messages(kind: str, messages: Sequence[MessageT]) -> Sequence[MessageT]:
    """The verified messages, each carrying the delivery span's context to be stored (the
    span starts now, continuing what they or the request carry); unchanged when off."""
    delivery = _delivery.get() if _tracer is not None else None
    if delivery is None:
        return messages
    delivery.kind = kind
    delivery.start([m.trace_context for m in messages])
    carrier = delivery.carrier()
    traced: list[MessageT] = [replace(m, trace_context=carrier) for m in messages]  # type: ignore[type-var]
    return traced


def delivery_outcome(message_id: str | None, outcome: str) -> None:
    """Note one outcome (`accepted`, `duplicate`, `rejected:<reason>` ...) on the delivery."""
    if _tracer is None:
        return
    delivery = _delivery.get()
    if delivery is not None:
        delivery.outcome(message_id, outcome)


# Attempts and admin actions ----------------------------------------------------------------


@dataclass(eq=False)
class AttemptTrace:
    span: Span

    def finished(self, outcome: str, error: str | None = None) -> None:
        self.span.set_attribute("inbox.outcome", outcome)
        if error:
            self.span.set_attribute("error.message", error[:1000])
            self.span.set_status(Status(StatusCode.ERROR, error[:200]))


@contextmanager
def attempt_span(
    source: str,
    message_id: str,
    row_id: int,
    attempt: int,
    handlers: Sequence[str],
    trace_context: Carrier | None,
) -> Iterator[AttemptTrace | None]:
    """The span of one processing attempt, current while it runs: a child of the delivery's
    stored context and linked to it. Yields None (and makes nothing) with tracing off."""
    if _tracer is None:
        yield None
        return
    parent = _context_of(trace_context)
    link = _link_to(trace_context)
    attributes: dict[str, AttributeValue] = {
        "inbox.source": source,
        "messaging.message.id": message_id,
        "inbox.id": row_id,
        "inbox.attempt": attempt,
        "inbox.handlers": list(handlers),
    }
    with _tracer.start_as_current_span(
        f"process {source}",
        context=parent,
        kind=SpanKind.CONSUMER,
        attributes=attributes,
        links=[link] if link is not None else None,
        record_exception=False,
        set_status_on_exception=True,
    ) as span:
        yield AttemptTrace(span)


@contextmanager
def admin_span(action: str, **attributes: str | int | bool) -> Iterator[Span | None]:
    """The span of one admin action (retry, replay, discard); None with tracing off."""
    if _tracer is None:
        yield None
        return
    with _tracer.start_as_current_span(
        f"admin {action}",
        attributes={
            "inbox.admin.action": action,
            **{f"inbox.{name}": value for name, value in attributes.items()},
        },
    ) as span:
        yield span
