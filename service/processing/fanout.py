"""Running one message's named destinations, each in a savepoint of its own, each with its own
outcome: a destination that fails is retried alone, and one that is done is never run again.

A message's row summarises its destinations (`summary_status`), its next attempt the soonest
of theirs.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime

import httpx

from service.core.schema import Status
from service.core.status import summary_status
from service.processing.forward import forward_message
from service.processing.handler_api import HandlerSession
from service.processing.pipeline import Pipeline, Run
from service.processing.policy import classify_failure
from service.processing.runner import (
    apply_handlers,
    end_handlers,
    inbox_message,
    log_failure,
    undo_handlers,
)
from service.store.claims import (
    AttemptResult,
    DestinationResult,
    MessageRow,
    MessageSavepoints,
    last_error_line,
)

# The destination statuses after which a destination does not run again unless an operator
# retries or replays it.
DONE = frozenset({Status.PROCESSED.value, Status.DEAD.value, Status.DISCARDED.value})
NO_DESTINATION = "no destination matched; processed without effect"
SKIPPED = "the message does not pass this destination's filter, or it is no longer configured"


def due_runs(pipeline: Pipeline, row: MessageRow) -> tuple[tuple[Run, ...], list[str]]:
    """The destinations to run for `row` on this attempt, and those due that it will not run.

    Before any has run: each the message matches. After: only those whose own state is pending
    or retrying, so a destination added to the config later never receives an older message
    unless an operator replays it there. A destination due (replayed to, or retrying) whose
    filter the message does not pass, or that is no longer configured, is not run: it is
    recorded as skipped, so that the message does not wait for it for ever."""
    runs = pipeline.runs_for_message(row.event_type, row.body)
    states = row.destinations
    if not states:
        return runs, []
    due = [name for name, status in states.items() if status not in DONE]
    kept = tuple(run for run in runs if run.destination.name in due)
    running = {run.destination.name for run in kept}
    return kept, [name for name in due if name not in running]


async def run_destinations(
    session: HandlerSession,
    savepoints: MessageSavepoints,
    pipeline: Pipeline,
    row: MessageRow,
    http: httpx.AsyncClient,
) -> tuple[AttemptResult, BaseException | None]:
    """Run each due destination of `row` in a savepoint (always isolated: one destination's
    failure must not undo another's effects). Returns the message's result, with one result
    per destination, and the first failure's exception."""
    attempt = row.attempts + 1
    started = datetime.now(UTC)
    runs, passed_over = due_runs(pipeline, row)
    results = [
        DestinationResult(name, Status.PROCESSED, "skipped", started, started, error=SKIPPED)
        for name in passed_over
    ]
    if not runs and not row.destinations:
        return AttemptResult(
            row.id, attempt, Status.PROCESSED, "skipped", started, started, error=NO_DESTINATION
        ), None
    limit = pipeline.config.handler_timeout_seconds
    message = inbox_message(row, attempt)
    delays: list[float] = []
    first_failure: BaseException | None = None
    for run in runs:
        name = run.destination.name
        begun = datetime.now(UTC)
        if run.destination.forward is not None:
            # The HTTP call holds no savepoint: it has no effect in this transaction.
            forwarded = await forward_message(
                http, row, attempt, pipeline.config, destination=run.destination
            )
            results.append(
                DestinationResult(
                    name,
                    forwarded.status,
                    forwarded.outcome,
                    begun,
                    forwarded.finished_at,
                    forwarded.error_type,
                    forwarded.error,
                    forwarded.traceback,
                )
            )
            if forwarded.delay_seconds is not None:
                delays.append(forwarded.delay_seconds)
            continue
        await savepoints.begin(statement_timeout_ms=math.ceil(limit * 1000))
        try:
            await apply_handlers(session, savepoints, run.handlers, message, limit)
            savepoints.release()
        except Exception as exc:
            await undo_handlers(session, savepoints)
            failure = classify_failure(exc, attempt, pipeline.config, budget_start=row.budget_start)
            log_failure(row, attempt, failure, destination=name)
            first_failure = first_failure or exc
            if failure.delay_seconds is not None:
                delays.append(failure.delay_seconds)
            results.append(
                DestinationResult(
                    name,
                    failure.status,
                    failure.outcome,
                    begun,
                    datetime.now(UTC),
                    failure.error_type,
                    failure.error,
                    failure.traceback,
                )
            )
            continue
        finally:
            end_handlers(session)
        results.append(
            DestinationResult(name, Status.PROCESSED, "processed", begun, datetime.now(UTC))
        )
    states = dict(row.destinations or {})
    states.update((r.name, r.status.value) for r in results)
    status = summary_status(states.values())
    failed = next((r for r in results if r.status != Status.PROCESSED), None)
    return AttemptResult(
        row.id,
        attempt,
        status,
        "processed" if failed is None else failed.outcome,
        started,
        datetime.now(UTC),
        delay_seconds=min(delays, default=0.0) if status == Status.RETRYING else None,
        # The message's last_error names the destination: "destination x: Type: message".
        error=None
        if failed is None
        else f"destination {failed.name}: {last_error_line(failed.error_type, failed.error)}",
        destinations=results,
    ), first_failure
