"""Each processing attempt as a span (service.core.tracing), around the runner; forwards get
theirs in `service.processing.forward`."""

from __future__ import annotations

from collections.abc import Awaitable

from service.core import tracing
from service.processing.pipeline import Pipeline
from service.store.results import AttemptResult, MessageRow


def handler_names(pipeline: Pipeline, event_type: str | None) -> list[str]:
    return [route.target for route in pipeline.routes if route.matches(event_type)]


async def in_attempt_span(
    run: Awaitable[tuple[AttemptResult, BaseException | None]], pipeline: Pipeline, row: MessageRow
) -> tuple[AttemptResult, BaseException | None]:
    """Await `run`, the attempt's `run_handlers(..., pipeline, row, ...)`, inside the attempt's
    span, so the handlers' own calls are its children."""
    if not tracing.enabled():
        return await run
    names = handler_names(pipeline, row.event_type)
    with tracing.attempt_span(
        row.source, row.message_id, row.id, row.attempts + 1, names, row.trace_context
    ) as span:
        result, exc = await run
        if span is not None:
            span.finished(result.outcome, describe(result))
    return result, exc


def describe(result: AttemptResult) -> str | None:
    if result.outcome in ("processed", "skipped"):
        return None
    return f"{result.error_type}: {result.error}" if result.error_type else result.error
