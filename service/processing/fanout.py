"""Running one message's named destinations, each with its own outcome: a destination that
fails is retried alone, and one that is done is never run again (the batch runs them
optimistically, or with a savepoint each: `run_destinations`).

A message's row summarises its destinations (`summary_status`), its next attempt the soonest
of theirs.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping
from datetime import UTC, datetime

import httpx

from service.core.schema import Status
from service.core.status import summary_status
from service.processing.forward import forward_message
from service.processing.gates import Deferral, DestinationGates
from service.processing.handler_api import HandlerSession, InboxMessage
from service.processing.pipeline import Pipeline, Run
from service.processing.runner import BatchDeadline, attempt_handlers, inbox_message
from service.store.attempts import last_error_line
from service.store.results import (
    DEFERRED,
    AttemptResult,
    DestinationResult,
    MessageRow,
)
from service.store.savepoints import MessageSavepoints

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


def expect_gated(gates: DestinationGates, pipeline: Pipeline, row: MessageRow) -> None:
    """Tell `gates` which of its gated destinations `row` is due to run."""
    if pipeline.gated:
        runs, _ = due_runs(pipeline, row)
        gates.expect(row, (run.destination for run in runs))


def deferred_result(
    name: str, status: str | None, deferral: Deferral, at: datetime
) -> DestinationResult:
    """A destination that may not run now: as it stands (pending when it never ran), due
    again after the deferral's wait."""
    return DestinationResult(
        name,
        Status(status) if status is not None else Status.PENDING,
        DEFERRED,
        at,
        at,
        error=deferral.reason,
        delay_seconds=deferral.wait_seconds,
        deferred=True,
        slot_at=deferral.slot_at,
    )


async def run_destinations(
    session: HandlerSession,
    savepoints: MessageSavepoints,
    pipeline: Pipeline,
    row: MessageRow,
    http: httpx.AsyncClient,
    *,
    isolated: bool = True,
    deadline: BatchDeadline | None = None,
    defer_flush: bool = False,
    failed: AttemptResult | None = None,
    gates: DestinationGates | None = None,
    forwarded: Mapping[str, DestinationResult] | None = None,
) -> tuple[AttemptResult, BaseException | None]:
    """Run each due destination of `row`; the message's result, with one result per
    destination, and the first failure's exception.

    `forwarded`: the forward destinations' outcomes, made before the batch's transaction
    began (`forward_destinations`), so that no transaction is open while an HTTP call is out;
    a due forward destination missing from it is called here.

    `isolated`: each destination in a savepoint of its own, so one destination's failure
    undoes its own effects only. Otherwise (the worker's optimistic batch, as `run_handlers`
    without isolation) no savepoint at all, and the first failure ends the run: the caller
    rolls the whole batch back and runs it again isolated, passing this result as `failed`,
    whose failed destinations are recorded again without running (their attempt is made) and
    whose others run again (their effects went with the rollback). A savepoint for every
    destination of every message of a batch is also what a batch must not have: past 64
    subtransactions, every snapshot of every backend consults pg_subtrans.

    `gates`: the batch's admissions of rate-limited destinations and forwards' breakers; a
    destination they hold back is deferred (it waits, pending, no attempt spent), and when
    every due destination is, the message's attempt is given back too (`AttemptResult.deferred`).
    A forward whose endpoint answers a 429 or 503 with `Retry-After` is deferred the same way.
    """
    attempt = row.attempts + 1
    started = datetime.now(UTC)
    runs, passed_over = due_runs(pipeline, row)
    states = dict(row.destinations or {})
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
    known_failures = (
        {d.name: d for d in (failed.destinations or ()) if d.status != Status.PROCESSED}
        if failed is not None
        else {}
    )
    if not isolated:
        await savepoints.limit_statements(math.ceil(limit * 1000))
    for run in runs:
        name = run.destination.name
        begun = datetime.now(UTC)
        outcome: DestinationResult | None = known_failures.get(name)
        if outcome is not None:
            results.append(outcome)
            if outcome.delay_seconds is not None:
                delays.append(outcome.delay_seconds)
            continue
        if gates is not None and run.destination.gated and run.destination.forward is None:
            deferral = await gates.admit(row, run.destination)
            if deferral is not None:
                results.append(deferred_result(name, states.get(name), deferral, begun))
                delays.append(deferral.wait_seconds)
                continue
        if run.destination.forward is not None:
            made = forwarded.get(name) if forwarded is not None else None
            outcome = made or await forward_destination(pipeline, row, run, http, gates)
            if outcome.deferred:
                results.append(outcome)
                delays.append(outcome.delay_seconds or 0.0)
                continue
        else:
            outcome, exc = await run_destination(
                session,
                savepoints,
                pipeline,
                row,
                run,
                message,
                isolated=isolated,
                deadline=deadline,
                defer_flush=defer_flush,
            )
            if exc is not None:
                first_failure = first_failure or exc
        results.append(outcome)
        if outcome.delay_seconds is not None:
            delays.append(outcome.delay_seconds)
        if first_failure is not None and not isolated:
            break  # the batch rolls back: the rest run in its isolated rerun
    states.update((r.name, r.status.value) for r in results)
    status = summary_status(states.values())
    deferred = bool(results) and all(r.deferred for r in results)
    if deferred and not row.destinations:
        status = Status.PENDING  # it never ran: it waits as it was accepted
    failed_one = next((r for r in results if r.status != Status.PROCESSED and not r.deferred), None)
    # What the message waits for: a failure, else the endpoint's Retry-After, else a gate.
    held = failed_one or min(
        (r for r in results if r.deferred), key=lambda r: not r.retry_after, default=None
    )
    return AttemptResult(
        row.id,
        attempt,
        status,
        failed_one.outcome if failed_one else DEFERRED if deferred else "processed",
        started,
        datetime.now(UTC),
        delay_seconds=min(delays, default=0.0) if status == Status.RETRYING or deferred else None,
        # The message's last_error names the destination: "destination x: Type: message".
        error=None
        if held is None
        else f"destination {held.name}: {last_error_line(held.error_type, held.error)}",
        destinations=results,
        deferred=deferred,
        retry_after=deferred and held is not None and held.retry_after,
    ), first_failure


async def forward_destination(
    pipeline: Pipeline,
    row: MessageRow,
    run: Run,
    http: httpx.AsyncClient,
    gates: DestinationGates | None,
) -> DestinationResult:
    """One forward destination's part of the attempt: admitted by its gates (else deferred),
    called, and its outcome counted towards its breaker (a failed probe is deferred)."""
    name, destination = run.destination.name, run.destination
    begun = datetime.now(UTC)
    status = (row.destinations or {}).get(name)
    if gates is not None and destination.gated:
        deferral = await gates.admit(row, destination)
        if deferral is not None:
            return deferred_result(name, status, deferral, begun)
    own = row.destination_state(name)
    made = await forward_message(
        http, row, own.next, pipeline.config, destination=destination, budget_start=own.budget_start
    )
    if gates is not None:
        probe = gates.forwarded(row, destination, made.status, made.error_type, made.error)
        if probe is not None:
            return deferred_result(name, status, probe, begun)
    return DestinationResult(
        name,
        # Deferred by its Retry-After: as it stands, like a gate's deferral.
        Status(status or Status.PENDING) if made.deferred else made.status,
        made.outcome,
        begun,
        made.finished_at,
        made.error_type,
        made.error,
        made.traceback,
        made.delay_seconds,
        deferred=made.deferred,
        retry_after=made.retry_after,
        fingerprint=made.fingerprint,
    )


async def forward_destinations(
    pipeline: Pipeline, row: MessageRow, http: httpx.AsyncClient, gates: DestinationGates | None
) -> dict[str, DestinationResult]:
    """The due forward destinations of `row` (its `destinations` loaded), called at once, with
    no transaction open: their outcomes, for `run_destinations` to record."""
    runs = [run for run in due_runs(pipeline, row)[0] if run.destination.forward is not None]
    made = await asyncio.gather(
        *(forward_destination(pipeline, row, run, http, gates) for run in runs)
    )
    return {result.name: result for result in made}


async def run_destination(
    session: HandlerSession,
    savepoints: MessageSavepoints,
    pipeline: Pipeline,
    row: MessageRow,
    run: Run,
    message: InboxMessage,
    *,
    isolated: bool,
    deadline: BatchDeadline | None,
    defer_flush: bool,
) -> tuple[DestinationResult, BaseException | None]:
    """One handler destination's part of the attempt, in its savepoint when `isolated`."""
    name = run.destination.name
    begun = datetime.now(UTC)
    failed = await attempt_handlers(
        session,
        savepoints,
        pipeline,
        row,
        run.handlers,
        message,
        isolated=isolated,
        deadline=deadline,
        defer_flush=defer_flush,
        destination=name,
        budget=row.destination_state(name),
    )
    if failed is not None:
        failure, exc = failed
        return DestinationResult(
            name,
            failure.status,
            failure.outcome,
            begun,
            datetime.now(UTC),
            failure.error_type,
            failure.error,
            failure.traceback,
            failure.delay_seconds,
            fingerprint=failure.fingerprint,
        ), exc
    return DestinationResult(name, Status.PROCESSED, "processed", begun, datetime.now(UTC)), None
