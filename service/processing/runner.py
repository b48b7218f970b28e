"""Running one message's Python handlers in a savepoint of the inbox's transaction."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime

from service.processing.api import HandlerCommitError, HandlerContext, HandlerSession, InboxMessage
from service.processing.pipeline import Pipeline
from service.processing.policy import classify_failure
from service.store.processing import AttemptResult, MessageRow, MessageSavepoints

log = logging.getLogger("service.processing")


class HandlerTimeout(Exception):
    """A message's handlers ran past the source's `handler_timeout_seconds`; retried."""


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


def no_handler_note(event_type: str | None) -> str:
    shown = "none" if event_type is None else repr(event_type)
    return f"no handler matches event type {shown}; processed without effect"


async def run_handlers(
    session: HandlerSession, savepoints: MessageSavepoints, pipeline: Pipeline, row: MessageRow
) -> tuple[AttemptResult, BaseException | None]:
    """Run every matching handler in a savepoint; keep their effects (released) or undo them.

    Returns the attempt's result and, for a failure, the exception. Exceptions that are not
    `Exception` (cancellation) propagate and take the whole transaction with them. The
    release or rollback is only queued on `savepoints`: the caller's next `begin()` or
    `flush()` sends it, before anything else runs on the connection.
    """
    attempt = row.attempts + 1
    started = datetime.now(UTC)
    handlers = pipeline.handlers_for(row.event_type)
    if not handlers:
        return AttemptResult(
            row.id,
            attempt,
            "processed",
            "skipped",
            started,
            started,
            error=no_handler_note(row.event_type),
        ), None
    message = inbox_message(row, attempt)
    ctx = HandlerContext(session)
    await savepoints.begin()
    try:
        session._handler_running = True
        limit = pipeline.config.handler_timeout_seconds
        try:
            async with asyncio.timeout(limit):
                for handler in handlers:
                    await handler(message, ctx)
        except TimeoutError as exc:
            raise HandlerTimeout(
                f"the handlers did not return within handler_timeout_seconds = {limit:g}"
            ) from exc
        finally:
            session._handler_running = False
        if session._commit_refused:
            # The handler caught the error its commit() raised; its effects are still not ours
            # to keep, since it believed they were committed on their own.
            raise HandlerCommitError("the handler called commit() or rollback() on ctx.session")
        # Flush, not commit: joined "rollback_only", a commit would only flush too, and then
        # end the session's transaction for the next message to begin again.
        await session.flush()
        savepoints.release()  # kept by the batch's COMMIT
    except Exception as exc:
        # This message's effects only; close() forgets the session's state and, joined as
        # "rollback_only", does not touch the batch's transaction.
        savepoints.rollback()
        await session.close()
        failure = classify_failure(exc, attempt, pipeline.config)
        log.warning(
            "handler failed",
            extra={
                "source": row.source,
                "message_id": row.message_id,
                "id": row.id,
                "attempt": attempt,
                "error_type": failure.error_type,
                "error": failure.error,
                "next_status": failure.status,
                "retry_in_s": failure.delay_seconds,
            },
        )
        return AttemptResult(
            row.id,
            attempt,
            failure.status,
            failure.outcome,
            started,
            datetime.now(UTC),
            delay_seconds=failure.delay_seconds,
            error_type=failure.error_type,
            error=failure.error,
            traceback=failure.traceback,
        ), exc
    finally:
        session._commit_refused = False
        session.expunge_all()
    return AttemptResult(
        row.id, attempt, "processed", "processed", started, datetime.now(UTC)
    ), None
