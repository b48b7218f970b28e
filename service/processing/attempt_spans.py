"""Each processing attempt as a span (service.core.tracing), around the runner; forwards get
theirs in `service.processing.forward`."""

from __future__ import annotations

from service.core import tracing
from service.processing.handler_api import HandlerSession
from service.processing.pipeline import Pipeline
from service.processing.runner import BatchDeadline, run_handlers
from service.store.claims import AttemptResult, MessageRow, MessageSavepoints


def handler_names(pipeline: Pipeline, event_type: str | None) -> list[str]:
    return [route.target for route in pipeline.routes if route.matches(event_type)]


async def run_handlers_traced(
    session: HandlerSession,
    savepoints: MessageSavepoints,
    pipeline: Pipeline,
    row: MessageRow,
    *,
    isolated: bool = True,
    deadline: BatchDeadline | None = None,
    defer_flush: bool = False,
) -> tuple[AttemptResult, BaseException | None]:
    """`run_handlers` inside the attempt's span, so the handlers' own calls are its children."""
    run = run_handlers(
        session,
        savepoints,
        pipeline,
        row,
        isolated=isolated,
        deadline=deadline,
        defer_flush=defer_flush,
    )
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
