"""Claim loops, the listener and the poller, supervised together, with a graceful stop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

import httpx
from sqlalchemy.ext.asyncio import AsyncEngine

from service.core.config import Settings
from service.core.metrics import Metrics
from service.inbox_config import InboxConfig
from service.processing.forward import forward_message, lease_seconds
from service.processing.pipeline import Pipeline
from service.processing.policy import retry_failure
from service.processing.runner import run_handlers
from service.retention import prune_periodically
from service.store.errors import StoreUnavailable
from service.store.notifications import listen_for_messages
from service.store.processing import (
    AttemptResult,
    MessageRow,
    batch_transaction,
    claim_due,
    expired_leases,
    finish_attempts,
    lease,
    message_savepoints,
    record_results,
    short_transaction,
)

log = logging.getLogger("service.worker")

REAP_LIMIT = 500
MAX_ERROR_BACKOFF_SECONDS = 30.0


@dataclass(frozen=True)
class WorkerOptions:
    concurrency: int = 4
    batch_size: int = 100
    poll_seconds: float = 2.0
    grace_seconds: float = 30.0
    lease_margin_seconds: float = 30.0

    @classmethod
    def from_settings(cls, settings: Settings) -> WorkerOptions:
        return cls(
            concurrency=settings.worker_concurrency,
            batch_size=settings.worker_batch_size,
            poll_seconds=settings.worker_poll_seconds,
            grace_seconds=settings.worker_grace_seconds,
            lease_margin_seconds=settings.worker_lease_margin_seconds,
        )


class WorkerCrashed(Exception):
    """A side task (listener, poller) or claim loop died; the worker stopped with it."""


def default_actor() -> str:
    return f"worker:{socket.gethostname()}:{os.getpid()}"


class Worker:
    """Runs `concurrency` claim loops; each claims a batch, runs it, and commits it at once.

    Python handlers run inside the claim transaction (one SAVEPOINT per message); forwards are
    leased in it and called after its commit. The listener wakes an idle loop on each NOTIFY;
    the poller wakes one every `poll_seconds` (retries coming due, missed notifications) and
    returns expired leases to the queue.
    """

    def __init__(
        self,
        engine: AsyncEngine,
        url: str,
        pipelines: Mapping[str, Pipeline],
        options: WorkerOptions | None = None,
        actor: str | None = None,
        *,
        metrics: Metrics | None = None,
        retention: InboxConfig | None = None,
    ) -> None:
        """`metrics` counts attempts; with `retention`, the worker also prunes periodically."""
        self.engine = engine
        self.metrics = metrics
        self.retention = retention
        self.url = url
        self.pipelines = dict(pipelines)
        self.sources = sorted(self.pipelines)
        self.options = options or WorkerOptions()
        self.actor = actor or default_actor()
        self._wakeups: list[asyncio.Event] = []
        self._idle: list[asyncio.Event] = []
        self._next = 0
        self._http: httpx.AsyncClient | None = None

    # Waking --------------------------------------------------------------------------------

    def wake_one(self) -> None:
        """Wake an idle claim loop, or (all busy) the next one, which looks again when done."""
        if self._idle:
            self._idle.pop().set()
        elif self._wakeups:
            self._next = (self._next + 1) % len(self._wakeups)
            self._wakeups[self._next].set()

    def wake_all(self) -> None:
        for event in self._wakeups:
            event.set()

    # Running -------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Work until `stop` is set, then give in-flight batches `grace_seconds` to finish."""
        log.info(
            "worker started",
            extra={
                "actor": self.actor,
                "sources": ",".join(self.sources),
                "concurrency": self.options.concurrency,
                "batch_size": self.options.batch_size,
            },
        )
        limits = httpx.Limits(max_connections=200, max_keepalive_connections=50)
        async with httpx.AsyncClient(limits=limits, follow_redirects=False) as http:
            self._http = http
            loops = [
                asyncio.create_task(self._claim_loop(i, stop), name=f"claim-loop-{i}")
                for i in range(self.options.concurrency)
            ]
            side = [
                asyncio.create_task(listen_for_messages(self.url, self.wake_one), name="listener"),
                asyncio.create_task(self._poll(), name="poller"),
            ]
            if self.retention is not None:
                pruner = prune_periodically(self.engine, self.retention, stop, metrics=self.metrics)
                side.append(asyncio.create_task(pruner, name="pruner"))
            stopping = asyncio.create_task(stop.wait(), name="stop")
            done, _ = await asyncio.wait(
                {stopping, *loops, *side}, return_when=asyncio.FIRST_COMPLETED
            )
            crashed = None if stopping in done else next(iter(done))
            stop.set()
            self.wake_all()
            _, unfinished = await asyncio.wait(loops, timeout=self.options.grace_seconds or None)
            if unfinished:
                log.warning(
                    "grace period over; cancelling in-flight batches (they roll back)",
                    extra={"batches": len(unfinished)},
                )
            for task in (*unfinished, *side, stopping):
                task.cancel()
            await asyncio.gather(*unfinished, *side, stopping, return_exceptions=True)
            self._http = None
        log.info("worker stopped", extra={"actor": self.actor})
        if crashed is not None:
            error = None if crashed.cancelled() else crashed.exception()
            raise WorkerCrashed(f"{crashed.get_name()} stopped: {error!r}") from error

    async def _claim_loop(self, index: int, stop: asyncio.Event) -> None:
        wake = asyncio.Event()
        self._wakeups.append(wake)
        wake.set()  # look once at start: work may be waiting already
        errors = 0
        while not stop.is_set():
            self._idle.append(wake)
            try:
                await wake.wait()
            finally:
                with contextlib.suppress(ValueError):
                    self._idle.remove(wake)
            wake.clear()
            while not stop.is_set():
                try:
                    claimed = await self.run_batch()
                    errors = 0
                except Exception as exc:
                    errors += 1
                    pause = min(0.25 * 2**errors, MAX_ERROR_BACKOFF_SECONDS)
                    level = logging.WARNING if isinstance(exc, StoreUnavailable) else logging.ERROR
                    log.log(
                        level,
                        "batch failed; rolled back, will claim again",
                        exc_info=not isinstance(exc, StoreUnavailable),
                        extra={"loop": index, "error": f"{type(exc).__name__}: {exc}"},
                    )
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), pause)
                    wake.set()
                    break
                if claimed < self.options.batch_size:
                    break
                self.wake_one()  # a full batch: more may be waiting, let another loop help

    async def run_batch(self) -> int:
        """Claim and run one batch; the number of messages claimed."""
        forwards: list[MessageRow] = []
        async with batch_transaction(self.engine) as batch:
            rows = await claim_due(batch.conn, self.sources, self.options.batch_size)
            if not rows:
                return 0
            results: list[AttemptResult] = []
            savepoints = await message_savepoints(batch.conn)
            for row in rows:
                pipeline = self.pipelines[row.source]
                if pipeline.forward is not None:
                    forwards.append(row)
                    continue
                result, _ = await run_handlers(batch.session, savepoints, pipeline, row)
                results.append(result)
            await savepoints.flush()
            await lease(
                batch.conn,
                [
                    (
                        row.id,
                        lease_seconds(
                            self.pipelines[row.source].config, self.options.lease_margin_seconds
                        ),
                    )
                    for row in forwards
                ],
            )
            await finish_attempts(batch.conn, results, self.actor)
        # Committed: effects and processed marks together, and the forwards' leases.
        self._count(rows, results)
        if forwards:
            await self._forward(forwards)
        return len(rows)

    async def _forward(self, rows: list[MessageRow]) -> None:
        assert self._http is not None
        http = self._http
        results = await asyncio.gather(
            *(
                forward_message(http, row, row.attempts + 1, self.pipelines[row.source].config)
                for row in rows
            )
        )
        recorded = await record_results(self.engine, results, self.actor, leased=True)
        self._count(rows, [r for r in results if r.id in recorded])
        for result in results:
            if result.id not in recorded:
                log.warning(
                    "forward outcome dropped: the lease expired and another attempt took over",
                    extra={"id": result.id, "attempt": result.attempt},
                )

    def _count(self, rows: list[MessageRow], results: list[AttemptResult]) -> None:
        if self.metrics is None:
            return
        source_of = {row.id: row.source for row in rows}
        for result in results:
            seconds = (result.finished_at - result.started_at).total_seconds()
            self.metrics.attempt_finished(source_of[result.id], result.outcome, seconds)

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.options.poll_seconds)
            self.wake_one()
            try:
                if await self.reap_expired_leases():
                    self.wake_one()
            except Exception as exc:
                log.warning("lease reaping failed", extra={"error": f"{type(exc).__name__}: {exc}"})

    async def reap_expired_leases(self) -> int:
        """Finish expired leases as abandoned attempts: retrying, or dead when out of attempts."""
        async with short_transaction(self.engine) as conn:
            expired = await expired_leases(conn, self.sources, REAP_LIMIT)
            now = datetime.now(UTC)
            results = []
            for message_id, source, attempts in expired:
                failure = retry_failure(
                    attempts,
                    self.pipelines[source].config,
                    "LeaseExpired",
                    "the lease expired before its worker recorded an outcome "
                    "(worker killed or stuck)",
                    None,
                )
                results.append(
                    AttemptResult(
                        message_id,
                        attempts,
                        failure.status,
                        "abandoned" if failure.status == "retrying" else "dead",
                        now,
                        now,
                        delay_seconds=failure.delay_seconds,
                        error_type=failure.error_type,
                        error=failure.error,
                    )
                )
            await finish_attempts(conn, results, self.actor, leased=True)
        if results:
            log.warning("expired leases reaped", extra={"count": len(results)})
        return len(results)
