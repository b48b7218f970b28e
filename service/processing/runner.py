"""Running one message's Python handlers in the inbox's transaction, in a savepoint or not."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import AsyncIterator, Coroutine, Sequence, Set
from contextlib import AbstractAsyncContextManager, asynccontextmanager, nullcontext
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection

from service.core.schema import Status
from service.processing.fingerprints import handler_fingerprint
from service.processing.handler_api import (
    Handler,
    HandlerCommitError,
    HandlerContext,
    HandlerOutbox,
    HandlerSession,
    InboxMessage,
)
from service.processing.pipeline import Pipeline
from service.processing.policy import Failure, classify_failure, failed_attempt
from service.store.results import AttemptResult, DestinationState, MessageRow
from service.store.savepoints import MessageSavepoints, message_savepoints

log = logging.getLogger("service.processing")


def handler_session(conn: AsyncConnection) -> HandlerSession:
    """A session that joins `conn`'s transaction; `MessageSavepoints` brackets each message.

    "rollback_only": the session's commit() only flushes and its close() leaves the
    connection's transaction alone. Its rollback() would roll back the whole batch, so the
    runner never calls it (and a handler may not): a failed message is undone by rolling back
    to its savepoint on the connection, then closing the session.
    """
    return HandlerSession(bind=conn, join_transaction_mode="rollback_only", expire_on_commit=False)


@asynccontextmanager
async def handler_scope(
    conn: AsyncConnection,
) -> AsyncIterator[tuple[HandlerSession, MessageSavepoints]]:
    """The session handlers stage effects in, and the savepoints that bracket each message,
    inside `conn`'s transaction (which must have begun)."""
    session = handler_session(conn)
    try:
        yield session, await message_savepoints(conn)
    finally:
        await session.close()


def session_rollback_bound(
    session: HandlerSession, isolated: bool
) -> AbstractAsyncContextManager[object]:
    """With `isolated`, a SAVEPOINT of the session's own around the message's handlers and
    flush: a flush that fails (a constraint broken by a staged row, in the inbox's flush, the
    handler's or an autoflush) makes the session roll back its transaction, and joined
    "rollback_only", that would be the whole batch's, the messages committed before this one
    with it. Bounded by the session's savepoint, it undoes this message's statements only, and
    the message's own savepoint (`MessageSavepoints`) is rolled back after it as for any other
    failure. Without `isolated`, a failure rolls the batch back whole anyway: nothing."""
    if isolated:
        return session.begin_nested()
    return nullcontext()


async def flush_effects(session: HandlerSession, savepoints: MessageSavepoints) -> None:
    """Send what the handlers staged: the session's own changes, then the rows of `ctx.insert`
    (which may refer to rows the session inserts).

    A flush, not a commit: joined "rollback_only", a commit would only flush too, and then end
    the session's transaction for the next message to begin again.
    """
    if session.new or session.dirty or session.deleted:
        await session.flush()
    if session.staged_rows:
        await session.staged_rows.write(savepoints.driver)


class HandlerTimeout(Exception):
    """A message's handlers ran past the source's `handler_timeout_seconds`; retried."""


# SQLSTATE of a statement cancelled on the server (statement_timeout, or our cancel request).
QUERY_CANCELED = "57014"
# After a handler's time is up and its statement cancelled: how long it may take to fail.
CANCEL_GRACE_SECONDS = 1.0


def timed_out(limit: float) -> HandlerTimeout:
    return HandlerTimeout(f"the handlers did not return within handler_timeout_seconds = {limit:g}")


def sqlstate(exc: DBAPIError) -> str | None:
    """The SQLSTATE of the driver error behind `exc`, if the driver reported one."""
    code = getattr(exc.orig, "sqlstate", None) or getattr(exc.orig, "pgcode", None)
    return code if isinstance(code, str) else None


def inbox_message(row: MessageRow, attempt: int) -> InboxMessage:
    return InboxMessage(
        id=row.id,
        source=row.source,
        message_id=row.message_id,
        event_type=row.event_type,
        attempt=attempt,
        headers=row.headers,
        body=row.body,
        content_type=row.content_type,
    )


def no_handler_note(event_type: str | None, *, by_payload: bool = False) -> str:
    shown = "none" if event_type is None else repr(event_type)
    what = f"event type {shown} and its payload" if by_payload else f"event type {shown}"
    return f"no handler matches {what}; processed without effect"


async def call_handlers(
    handlers: Sequence[Handler], message: InboxMessage, ctx: HandlerContext
) -> None:
    """The handlers, in order. (The loop watchdog finds the one running in this frame.)"""
    for handler in handlers:
        await handler(message, ctx)


async def run_within(
    limit: float, work: Coroutine[Any, Any, None], savepoints: MessageSavepoints
) -> None:
    """Await `work`, or end it after `limit` seconds with `HandlerTimeout`.

    Past the limit, a statement still running is cancelled on the server first, and the
    handler gets CANCEL_GRACE_SECONDS to fail of that (an ordinary error, after which the
    savepoint rolls back as usual); only then is its task cancelled. Cancelling a task inside a
    driver call would cost the connection, and with it the whole batch's transaction.
    """
    task = asyncio.ensure_future(work)
    try:
        done, _ = await asyncio.wait({task}, timeout=limit)
        if done:
            return task.result()  # the handlers' own outcome
        await savepoints.cancel_statement()
        done, _ = await asyncio.wait({task}, timeout=CANCEL_GRACE_SECONDS)
    except BaseException:  # our own cancellation (shutdown): the handlers go with us
        task.cancel()
        raise
    if not done:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        raise timed_out(limit)
    raise timed_out(limit) from (None if task.cancelled() else task.exception())


class BatchDeadline:
    """The time limit of each message run inline in an optimistic batch (no task per message).

    Past a message's limit, the statement running on the batch's connection, if any, is
    cancelled on the server; if the handlers have not failed of that within
    CANCEL_GRACE_SECONDS, the batch's own task is cancelled. Either way the message fails with
    `HandlerTimeout`. Cancelling the task may cost the connection: harmless here, since a
    failure in an optimistic batch rolls its whole transaction back and the batch runs again
    isolated, its timed-out message recorded without running again.
    """

    def __init__(self, savepoints: MessageSavepoints) -> None:
        self._savepoints = savepoints
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.current_task()
        self._run = 0  # which message's run a timer or stopper belongs to
        self._expired = False
        self._cancelled_task = False
        self._stopper: asyncio.Task[None] | None = None

    async def run(self, limit: float, work: Coroutine[Any, Any, None]) -> None:
        """Await `work` inline; `HandlerTimeout` if it outlives `limit`."""
        self._run += 1
        self._expired = self._cancelled_task = False
        timer = self._loop.call_later(limit, self._expire, self._run)
        try:
            await work
        except asyncio.CancelledError:
            if not self._cancelled_task:
                raise  # our own cancellation (shutdown): the handlers go with us
            raise timed_out(limit) from None
        except Exception as exc:
            if self._expired:
                raise timed_out(limit) from exc
            raise
        finally:
            self._run += 1  # a stopper still under way now does nothing
            timer.cancel()
            if self._cancelled_task and self._task is not None:
                self._task.uncancel()
        if self._expired:
            raise timed_out(limit)

    def _expire(self, run: int) -> None:
        if run == self._run:
            self._expired = True
            self._stopper = asyncio.ensure_future(self._cancel_then_stop(run))

    async def _cancel_then_stop(self, run: int) -> None:
        try:
            await self._savepoints.cancel_statement()
        except Exception as exc:
            log.warning(
                "could not cancel a timed-out handler's statement",
                extra={"error": f"{type(exc).__name__}: {exc}"},
            )
        if run != self._run:
            return
        await asyncio.sleep(CANCEL_GRACE_SECONDS)
        if run == self._run and self._task is not None:
            self._cancelled_task = True
            self._task.cancel()

    async def close(self) -> None:
        """Wait for a stopper still under way (at most its cancel request and its sleep)."""
        if self._stopper is not None and not self._stopper.done():
            self._stopper.cancel()
            await asyncio.gather(self._stopper, return_exceptions=True)


async def apply_handlers(
    session: HandlerSession,
    savepoints: MessageSavepoints,
    handlers: Sequence[Handler],
    message: InboxMessage,
    limit: float,
    *,
    isolated: bool = True,
    deadline: BatchDeadline | None = None,
    defer_flush: bool = False,
    destination: str | None = None,
    endpoints: Set[str] | None = None,
) -> None:
    """Run `handlers` on `message` within `limit` seconds and flush what they staged (unless
    `defer_flush`); raise what failed. The caller has begun the message's savepoint (or, not
    `isolated`, bounded the transaction's statements), and on a failure must `undo_handlers`.
    `destination`, `endpoints`: for `ctx.outbox` (its keys, and the endpoints it may name).
    """
    clock = time.monotonic()
    outbox = HandlerOutbox(session, message.source, message.message_id, destination, endpoints)
    ctx = HandlerContext(session, outbox)
    async with session_rollback_bound(session, isolated):
        session._handler_running = True
        try:
            if deadline is None:
                await run_within(limit, call_handlers(handlers, message, ctx), savepoints)
            else:
                await deadline.run(limit, call_handlers(handlers, message, ctx))
        except DBAPIError as exc:
            if sqlstate(exc) == QUERY_CANCELED:  # the savepoint's statement_timeout
                raise timed_out(limit) from exc
            raise
        finally:
            session._handler_running = False
        if time.monotonic() - clock > limit:
            # A handler that blocked the event loop (time.sleep, CPU work) past its limit:
            # no timer could fire meanwhile, but the limit holds all the same.
            raise timed_out(limit)
        if session._commit_refused:
            # The handler caught the error its commit() raised; its effects are still not
            # ours to keep, since it believed they were committed on their own.
            raise HandlerCommitError("the handler called commit() or rollback() on ctx.session")
        if not defer_flush:
            await flush_effects(session, savepoints)


async def undo_handlers(
    session: HandlerSession, savepoints: MessageSavepoints, *, isolated: bool = True
) -> None:
    """After a failure of `apply_handlers`: undo this message's effects only. close() forgets
    the session's state and, joined as "rollback_only", does not touch the batch's transaction.
    """
    if isolated:
        savepoints.rollback()
    await session.close()
    session.staged_rows.clear()


def end_handlers(session: HandlerSession, deadline: BatchDeadline | None = None) -> None:
    """After a message's handlers, whatever their outcome: the session as the next one needs it."""
    session._commit_refused = False
    if deadline is None and session.sync_session.identity_map:
        session.expunge_all()


def log_failure(
    row: MessageRow, attempt: int, failure: Failure, destination: str | None = None
) -> None:
    extra: dict[str, object] = {
        "source": row.source,
        "message_id": row.message_id,
        "id": row.id,
        "attempt": attempt,
        "error_type": failure.error_type,
        "error": failure.error,
        "next_status": failure.status,
        "retry_in_s": failure.delay_seconds,
    }
    if destination is not None:
        extra["destination"] = destination
    if failure.fingerprint is not None:
        extra["fingerprint"] = failure.fingerprint.key
    log.warning("handler failed", extra=extra)


async def attempt_handlers(
    session: HandlerSession,
    savepoints: MessageSavepoints,
    pipeline: Pipeline,
    row: MessageRow,
    handlers: Sequence[Handler],
    message: InboxMessage,
    *,
    isolated: bool,
    deadline: BatchDeadline | None,
    defer_flush: bool,
    destination: str | None = None,
    budget: DestinationState | None = None,
) -> tuple[Failure, Exception] | None:
    """One try of `handlers` on `message` (the whole message's, or `destination`'s) within the
    source's handler timeout, in a savepoint of its own when `isolated` (otherwise the caller
    has bounded the transaction's statements): kept, answering None, or undone, answering the
    failure, classified and logged, with what raised it. A failure is classified on the
    message's attempts, or on `budget`, a named destination's own."""
    limit = pipeline.config.handler_timeout_seconds
    if isolated:
        await savepoints.begin(statement_timeout_ms=math.ceil(limit * 1000))
    try:
        await apply_handlers(
            session,
            savepoints,
            handlers,
            message,
            limit,
            isolated=isolated,
            deadline=deadline,
            defer_flush=defer_flush,
            destination=destination,
            endpoints=pipeline.endpoints,
        )
        if isolated:
            savepoints.release()  # kept by the batch's COMMIT
    except Exception as exc:
        await undo_handlers(session, savepoints, isolated=isolated)
        attempt, start = (
            (message.attempt, row.budget_start)
            if budget is None
            else (budget.next, budget.budget_start)
        )
        failure = classify_failure(exc, attempt, pipeline.config, budget_start=start)
        cause = handler_fingerprint(
            exc, row.source, destination, failure.error_type, call_handlers.__code__
        )
        failure = replace(failure, fingerprint=cause)
        log_failure(row, message.attempt, failure, destination)
        return failure, exc
    finally:
        end_handlers(session, deadline)
    return None


async def run_handlers(
    session: HandlerSession,
    savepoints: MessageSavepoints,
    pipeline: Pipeline,
    row: MessageRow,
    *,
    isolated: bool = True,
    deadline: BatchDeadline | None = None,
    defer_flush: bool = False,
) -> tuple[AttemptResult, BaseException | None]:
    """Run every matching handler in a savepoint; keep their effects (released) or undo them.

    Returns the attempt's result and, for a failure, the exception. Exceptions that are not
    `Exception` (cancellation) propagate and take the whole transaction with them. The
    release or rollback is only queued on `savepoints`: the caller's next `begin()` or
    `flush()` sends it, before anything else runs on the connection.

    `isolated=False`: no savepoint (one round trip less per message). A failure then leaves
    the transaction holding its effects, or aborted, so the caller must roll the whole
    transaction back and not write anything more in it.

    `deadline` (with `isolated=False`, the worker's optimistic batch): the handlers run inline
    under it, not in a task of their own. `defer_flush`: their staged effects are not flushed
    here; the caller sends them once for the batch (`flush_effects`: same-table INSERTs then
    go out as one multi-row statement, `ctx.insert` rows as one COPY), and must treat a
    failing flush as a failure of the batch.
    """
    attempt = row.attempts + 1
    started = datetime.now(UTC)
    handlers = pipeline.handlers_for_message(row.event_type, row.body)
    if not handlers:
        return AttemptResult(
            row.id,
            attempt,
            Status.PROCESSED,
            "skipped",
            started,
            started,
            error=no_handler_note(row.event_type, by_payload=pipeline.reads_payload),
        ), None
    if not isolated:
        await savepoints.limit_statements(math.ceil(pipeline.config.handler_timeout_seconds * 1000))
    failed = await attempt_handlers(
        session,
        savepoints,
        pipeline,
        row,
        handlers,
        inbox_message(row, attempt),
        isolated=isolated,
        deadline=deadline,
        defer_flush=defer_flush,
    )
    if failed is not None:
        failure, exc = failed
        return failed_attempt(row.id, attempt, failure, started, datetime.now(UTC)), exc
    return AttemptResult(
        row.id, attempt, Status.PROCESSED, "processed", started, datetime.now(UTC)
    ), None
