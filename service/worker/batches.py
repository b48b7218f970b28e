"""Running a batch of Python handlers (and named destinations) in one transaction: optimistic
first, isolated when a handler fails, outcomes recorded with the effects."""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from datetime import UTC, datetime

from sqlalchemy.ext.asyncio import AsyncConnection

from service.processing.attempt_spans import in_attempt_span
from service.processing.fanout import expect_gated, run_destinations
from service.processing.fingerprints import fingerprint
from service.processing.gates import DestinationGates
from service.processing.handler_api import HandlerSession
from service.processing.ordering import Stopped, behind
from service.processing.policy import UNCONFIGURED_POLICY, failed_attempt, retry_failure
from service.processing.runner import BatchDeadline, flush_effects, handler_scope, run_handlers
from service.store.attempts import finish_attempts, load_destinations, record_results
from service.store.claims import RESTORE_PLANS, ExpiredLease, hold_claimed, lock_due, record_claims
from service.store.results import AttemptResult, MessageRow
from service.store.savepoints import MessageSavepoints, batch_transaction
from service.worker.base import Claimed, WorkerBase

log = logging.getLogger("service.worker")

NEVER_FINISHED = (
    "the attempt never finished: its worker process exited or was killed, or lost the "
    "database, before recording an outcome (claim expired)"
)
# After a handler of a source fails in a batch run without savepoints, that source's batches
# run with a savepoint per message for this long.
ISOLATE_AFTER_FAILURE_SECONDS = 10.0


class _OptimisticRunFailed(Exception):
    """A handler failed in a batch run without savepoints, or the batch's one flush of the
    staged effects did (`row` None: no message to blame): the batch's transaction rolls back,
    and the batch runs again isolated."""

    def __init__(self, row: MessageRow | None, result: AttemptResult | None) -> None:
        super().__init__(
            "the staged effects' flush failed in an optimistic batch"
            if row is None
            else f"message {row.id} failed in an optimistic batch"
        )
        self.row = row
        self.result = result


class Batches(WorkerBase):
    """Batches of Python handlers, each one transaction with its outcomes."""

    async def _run_handlers(self, claimed: Claimed) -> int:
        """Run Python handlers in one transaction: their effects commit with the outcomes. The
        number of messages claimed (`lock_due`'s, or the leased rows given).

        Optimistically first: no savepoint per message, one round trip less each, and the
        effects staged with `ctx.session.add` or `ctx.insert` sent once at the end. When a
        handler fails, the whole transaction rolls back (the effects of the messages before it
        with it) and the batch runs again with a savepoint per message, its failed message
        recorded without running a second time. When the one flush fails, no message is to
        blame yet: the batch runs again isolated, each message's effects flushed in its own
        savepoint, which names the bad one (`session_rollback_bound` keeps the session's
        rollback of a failed flush to that message). No handler runs a third time in one
        attempt. A source whose batch fell back runs isolated for
        `ISOLATE_AFTER_FAILURE_SECONDS`, so failing messages do not make every batch run twice.
        When the transaction itself fails (the database, not a handler), the attempts counted
        are ended as failures (`_end_attempts`).
        """
        try:
            return await self._run_optimistically(claimed)
        except Exception as exc:
            if claimed.rows and not isinstance(exc, _OptimisticRunFailed):
                await self._end_attempts(claimed, exc)
            raise
        finally:
            if claimed.gates is not None:
                await self._settle(claimed.gates)

    async def _run_optimistically(self, claimed: Claimed) -> int:
        try:
            return await self._run_batch(claimed, isolated=None, defer_flush=True)
        except _OptimisticRunFailed as failed:
            if failed.row is None or failed.result is None:
                # The batch's one flush of its staged effects failed, and no message is to
                # blame yet. The isolated run flushes each message's effects in its savepoint,
                # which names the bad ones and commits the others (no handler runs a third
                # time); the sources of the bad ones run isolated next.
                await self._run_batch(claimed, isolated=True, isolate_failed=True)
            else:
                self._isolate(failed.row.source)
                await self._run_batch(claimed, isolated=True, failed=(failed.row, failed.result))
            return len(claimed.rows)

    def _isolate(self, source: str) -> None:
        """Run `source`'s batches with a savepoint per message for a while, after a failure."""
        self._isolate_until[source] = time.monotonic() + ISOLATE_AFTER_FAILURE_SECONDS

    def _isolating(self, rows: list[MessageRow]) -> bool:
        """Whether a batch of `rows` runs with a savepoint per message: after a failure of one
        of their sources. (Named destinations' forwards are called before the transaction,
        `_run_fanout`, so a rollback sends none of them again.)"""
        now = time.monotonic()
        return any(self._isolate_until.get(row.source, 0.0) > now for row in rows)

    async def _hold(
        self, conn: AsyncConnection, claimed: Claimed
    ) -> tuple[set[int], list[MessageRow]]:
        """Lock the batch's rows in `conn`'s transaction: the ids still owned by this attempt,
        and the messages whose last attempt never finished (found only by the first
        transaction of a locked batch, which claims here; see `_abandon`)."""
        if claimed.leased or claimed.locked:
            return await hold_claimed(conn, claimed.rows, leased=claimed.leased), []
        claimed.locked = True
        sources = self._free if claimed.sources is None else claimed.sources
        limit = self.options.batch_size if claimed.limit is None else claimed.limit
        batch = await lock_due(conn, list(sources), limit, keyed=self._keyed)
        await record_claims(self.engine, batch.rows, sources, self.actor)
        claimed.rows = batch.rows  # counted, committed
        return {row.id for row in batch.rows}, batch.abandoned

    def _abandon(self, rows: list[MessageRow]) -> list[AttemptResult]:
        """The outcomes of attempts that never finished (claims that expired unreleased)."""
        now = datetime.now(UTC)
        return [
            self._never_finished(row.id, row.source, row.attempts + 1, row.budget_start, now)
            for row in rows
        ]

    def _reaped(self, expired: list[ExpiredLease]) -> list[AttemptResult]:
        """The outcomes of the reaper's expired claims (`_abandon`'s, for what it found)."""
        now = datetime.now(UTC)
        return [
            self._never_finished(lease.id, lease.source, lease.attempts, lease.budget_start, now)
            for lease in expired
        ]

    def _never_finished(
        self, message: int, source: str, attempt: int, budget_start: int, now: datetime
    ) -> AttemptResult:
        """Attempt `attempt` of message `message` (its id) never finished: retrying (to run
        alone next), or dead when out of attempts. A source no longer configured here gets the
        default retry policy: its message waits, retrying, for a worker that has the source."""
        pipeline = self.pipelines.get(source)
        failure = retry_failure(
            attempt,
            pipeline.config if pipeline is not None else UNCONFIGURED_POLICY,
            "AttemptNeverFinished",
            NEVER_FINISHED,
            None,
            budget_start=budget_start,
            abandoned=True,
        )
        failure = replace(failure, fingerprint=fingerprint(source, failure.error_type))
        return failed_attempt(message, attempt, failure, now, now, unfinished=True)

    async def _run_batch(
        self,
        claimed: Claimed,
        *,
        isolated: bool | None,
        defer_flush: bool = False,
        failed: tuple[MessageRow, AttemptResult] | None = None,
        isolate_failed: bool = False,
    ) -> int:
        """One transaction: hold the claims (or claim), run the handlers, record the outcomes,
        commit. The number of messages claimed.

        `isolated` None: with a savepoint per message if the batch's sources are isolating,
        else without. `failed`: a message whose attempt already failed (in an optimistic run
        rolled back since); its outcome is recorded with the others and its handlers are not
        run again. `isolate_failed`: the source of each message that fails runs isolated for
        `ISOLATE_AFTER_FAILURE_SECONDS`.
        """
        async with batch_transaction(self.engine) as conn:
            held, abandoned = await self._hold(conn, claimed)
            results = self._abandon(abandoned)
            rows = claimed.rows
            if isolated is None:
                isolated = self._isolating(rows)
                defer_flush = defer_flush and not isolated
            fanning = [row for row in rows if self.pipelines[row.source].fans_out]
            await load_destinations(conn, fanning)
            if claimed.gates is None and any(self.pipelines[r.source].gated for r in fanning):
                claimed.gates = DestinationGates(self.engine, self.pipelines)
                for row in fanning:
                    expect_gated(claimed.gates, self.pipelines[row.source], row)
            # An ordering key's run stops at its first message that does not succeed.
            stopped = Stopped(abandoned)
            async with handler_scope(conn) as (session, savepoints):
                # Sorts left off by lock_due, plans by id by hold_claimed (or a no-op).
                savepoints.defer(RESTORE_PLANS)
                deadline = None if isolated else BatchDeadline(savepoints)
                try:
                    for row in rows:
                        if stopped.holds(row):
                            if row.id in held:
                                results.append(behind(row))
                            continue
                        if row.id not in held:
                            stopped.stop(row)
                            log.warning(
                                "claim lost before its handlers ran (reaped or claimed again); "
                                "skipped",
                                extra={
                                    "source": row.source,
                                    "message_id": row.message_id,
                                    "id": row.id,
                                },
                            )
                            continue
                        pipeline = self.pipelines[row.source]
                        earlier = failed[1] if failed is not None and row is failed[0] else None
                        if pipeline.fans_out:
                            # A failed message's destinations that did not fail run again.
                            assert self._http is not None
                            run = run_destinations(
                                session,
                                savepoints,
                                pipeline,
                                row,
                                self._http,
                                isolated=isolated,
                                deadline=deadline,
                                defer_flush=defer_flush,
                                failed=earlier,
                                gates=claimed.gates,
                                forwarded=(claimed.forwarded or {}).get(row.id),
                            )
                        elif earlier is not None:
                            stopped.stop(row, earlier)
                            results.append(earlier)
                            continue
                        else:
                            run = run_handlers(
                                session,
                                savepoints,
                                pipeline,
                                row,
                                isolated=isolated,
                                deadline=deadline,
                                defer_flush=defer_flush,
                            )
                        result, exc = await in_attempt_span(run, pipeline, row)
                        if exc is not None and not isolated:
                            raise _OptimisticRunFailed(row, result)
                        if exc is not None and isolate_failed:
                            self._isolate(row.source)
                        stopped.stop(row, result)
                        results.append(result)
                finally:
                    # A stopper still under way (a message past its limit) ends before the
                    # transaction does, so its cancel request never reaches a later use of
                    # this connection.
                    if deadline is not None:
                        await deadline.close()
                if defer_flush:
                    await self._flush_staged(session, savepoints)
                await finish_attempts(
                    conn,
                    results,
                    self.actor,
                    leased=claimed.leased,
                    savepoints=savepoints,
                    sources={row.id: row.source for row in fanning},
                )
        # Committed: effects and processed marks together.
        if self._ordered and any(row.source in self._ordered for row in rows):
            self._claim_again = True
        if abandoned:
            log.warning("expired claims reaped", extra={"count": len(abandoned)})
        self._count([*rows, *abandoned], results)
        return len(rows) + len(abandoned)

    @staticmethod
    async def _flush_staged(session: HandlerSession, savepoints: MessageSavepoints) -> None:
        """The optimistic batch's staged effects (`ctx.session.add`, `ctx.insert`), sent once."""
        try:
            await flush_effects(session, savepoints)
        except Exception as exc:
            log.warning(
                "the batch's staged effects failed to flush; "
                "running it again with a savepoint and a flush per message",
                extra={"error": f"{type(exc).__name__}: {exc}"},
            )
            raise _OptimisticRunFailed(None, None) from exc

    async def _end_attempts(self, claimed: Claimed, exc: Exception) -> None:
        """The batch's transaction failed (the database, not a handler): end its attempts now
        as retryable failures instead of leaving them to expire. Best effort: if the database
        is gone, they are recorded as abandoned once their claims expire."""
        rows = claimed.rows
        now = datetime.now(UTC)
        error = f"the attempt's transaction failed: {type(exc).__name__}: {exc}"
        results = [
            failed_attempt(
                row.id,
                row.attempts + 1,
                replace(
                    retry_failure(
                        row.attempts + 1,
                        self.pipelines[row.source].config,
                        "TransactionFailed",
                        error,
                        None,
                        budget_start=row.budget_start,
                    ),
                    fingerprint=fingerprint(row.source, "TransactionFailed"),
                ),
                now,
                now,
            )
            for row in rows
        ]
        try:
            await record_results(self.engine, results, self.actor, leased=claimed.leased)
        except Exception as again:
            log.warning(
                "could not end the failed batch's attempts; their claims will expire",
                extra={"error": f"{type(again).__name__}: {again}", "count": len(rows)},
            )

    def _count(self, rows: list[MessageRow], results: list[AttemptResult]) -> None:
        if self.metrics is None:
            return
        source_of = {row.id: row.source for row in rows}
        for result in results:
            if not result.deferred:  # held by its destinations' gates: no attempt made
                seconds = (result.finished_at - result.started_at).total_seconds()
                self.metrics.attempt_finished(source_of[result.id], result.outcome, seconds)
            for part in result.destinations or ():
                if not part.deferred:
                    self.metrics.destination_finished(source_of[result.id], part.name, part.outcome)

    async def _settle(self, gates: DestinationGates) -> None:
        """After a batch (and its reruns): settle its destinations' admissions (`gates`), count
        them, and look again when the first run it deferred is due. Best effort: a bucket not
        given back refills, and a reservation not released expires."""
        try:
            settled = await gates.settle()
        except Exception as exc:
            log.warning(
                "could not settle the batch's destination rate limits and breakers",
                extra={"error": f"{type(exc).__name__}: {exc}"},
            )
            return
        for c in settled.changes:
            self._breaker_changed(c.source, c.change, c.error, c.cooldown_seconds, c.destination)
        if self.metrics is not None:
            for (source, destination), count in settled.claimed.items():
                self.metrics.rate_limit_claimed(source, count, destination)
            for (source, destination), seconds in settled.waited.items():
                self.metrics.rate_limit_waited(source, seconds, destination)
        if settled.next_due is not None:
            self._wake_later(settled.next_due)
