"""Claim loops, the listener and the poller, supervised together, with a graceful stop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import socket
from collections.abc import Mapping

import httpx
from sqlalchemy.ext.asyncio import AsyncEngine

from service.core.metrics import Metrics
from service.processing.forward import lease_seconds
from service.processing.pipeline import Pipeline
from service.sources.config_file import InboxConfig
from service.store.attempts import finish_attempts
from service.store.claims import (
    alone_due,
    claim_due,
    expired_claims_of_other_sources,
    expired_leases,
    keyed_sources,
)
from service.store.errors import StoreUnavailable
from service.store.notifications import listen_for_messages
from service.store.receipts import fold_receipts
from service.store.results import MessageRow
from service.store.savepoints import short_transaction
from service.worker.base import Claimed, WorkerOptions
from service.worker.batches import Batches
from service.worker.dead_letter_alerts import (
    alert_periodically,
    start_alerts,
)
from service.worker.gate import Gate
from service.worker.gating import Gating
from service.worker.leasing import Leasing
from service.worker.retention import prune_periodically
from service.worker.watchdog import LoopWatchdog

log = logging.getLogger("service.worker")

REAP_LIMIT = 500
MAX_ERROR_BACKOFF_SECONDS = 30.0


class WorkerCrashed(Exception):
    """A side task (listener, poller) or claim loop died; the worker stopped with it."""


def default_actor() -> str:
    return f"worker:{socket.gethostname()}:{os.getpid()}"


class Worker(Gating, Leasing, Batches):
    """Runs `concurrency` claim loops; each claims a batch, runs it, and commits it at once.

    Python handlers run inside one transaction per batch (a SAVEPOINT per message only once a
    handler has failed, see `_run_handlers`); forwards are leased by the claim and called
    after it commits. The listener wakes an idle loop on each NOTIFY (at most once per
    `linger_seconds` after a batch began); the poller wakes one every `poll_seconds` (retries
    coming due, missed notifications) and returns expired leases to the queue.
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
        """`metrics` counts attempts; with `retention` (the sources file), the worker also
        prunes periodically and sends its dead-letter alerts."""
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
        # Each source's claim lease: a forward's HTTP timeout plus the margin; for Python
        # handlers the margin alone, since their transaction holds the row locks meanwhile.
        self._leases = {
            name: lease_seconds(pipeline.config, self.options.lease_margin_seconds)
            for name, pipeline in sorted(self.pipelines.items())
        }
        # Python handlers' sources are claimed by locking their rows in the batch's own
        # transaction (0008); forwards' by leasing them, since no transaction spans the call.
        # A source with gates (a rate limit; a forward's circuit breaker) is claimed on its
        # own, as many as its gates admit (`_run_gated`); the others together.
        self._gates = {name: p.gates for name, p in sorted(self.pipelines.items())}
        self._gated = [name for name, gates in self._gates.items() if gates.any]
        # Whether a gated source's last claim took all it was admitted (more may be due).
        self._gated_backlog = dict.fromkeys(self._gated, True)
        # Leased rather than locked: a forward, and a source whose named destinations
        # forward (no transaction may be open while an HTTP call is out).
        self._leased = {
            name for name, p in self.pipelines.items() if p.forward or p.forwards_in_batch
        }
        self._free = {
            name: lease
            for name, lease in self._leases.items()
            if name not in self._gated and name not in self._leased
        }
        self._free_leased = {
            name: lease
            for name, lease in self._leases.items()
            if name not in self._gated and name in self._leased
        }
        self._gate = Gate()
        self._alone_due = False
        self._isolate_until: dict[str, float] = {}  # source -> time.monotonic()
        self._last_batch = -math.inf  # when a batch last began (the event loop's clock)
        # Until when deliveries count as arriving (the event loop's clock; `_notified`).
        self._ingesting_until = -math.inf
        self._lingering: asyncio.TimerHandle | None = None
        # A batch just finished messages with an ordering key: the next of each key may be
        # due now, so claim again at once instead of waiting for a wake-up (a partial batch
        # does not mean an empty backlog when keys hold messages back).
        self._ordered = {name for name, p in self.pipelines.items() if p.config.ordering_key}
        # The sources whose keyed messages are claimed from their keys' heads: those with an
        # ordering key, and (found at start) those that had one and still hold keyed messages.
        self._keyed = set(self._ordered)
        self._claim_again = False
        self._notices: set[asyncio.Task[None]] = set()  # circuit-breaker notices being sent

    # Waking --------------------------------------------------------------------------------

    def wake_one(self) -> None:
        """Wake an idle claim loop, or (all busy) the next one, which looks again when done;
        while deliveries are arriving, only one of those that run then (`_running_loops`)."""
        running = self._running_loops()
        idle = [wake for wake in self._idle if self._wakeups.index(wake) < running]
        if idle:
            self._idle.remove(idle[-1])
            idle[-1].set()
        elif self._wakeups:
            self._next = (self._next + 1) % min(running, len(self._wakeups))
            self._wakeups[self._next].set()

    def _running_loops(self) -> int:
        """How many claim loops run batches now: all, or while deliveries are arriving, the
        first `WorkerOptions.loops_while_ingesting` (ingest first)."""
        if asyncio.get_running_loop().time() < self._ingesting_until:
            return self.options.loops_while_ingesting
        return self.options.concurrency

    def _notified(self) -> None:
        """Deliveries were committed (a NOTIFY, or the listener reconnected): wake a claim loop
        now, or, if a batch began less than `linger_seconds` ago, once that long has passed
        since it began. What ingest commits meanwhile is then claimed as one batch rather than
        as a small batch per commit, each paying a batch's round trips and statements."""
        loop = asyncio.get_running_loop()
        self._ingesting_until = loop.time() + self.options.ingest_quiet_seconds
        if self._lingering is not None:
            return  # a wake is already due
        wait = self._last_batch + self.options.linger_seconds - loop.time()
        if wait <= 0:
            self.wake_one()
        else:
            self._lingering = loop.call_later(wait, self._lingered)

    def _lingered(self) -> None:
        self._lingering = None
        self.wake_one()

    def _stop_lingering(self) -> bool:
        """Cancel a wake a notification set for later; whether one was pending."""
        if self._lingering is None:
            return False
        self._lingering.cancel()
        self._lingering = None
        return True

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
        watchdog = LoopWatchdog(asyncio.get_running_loop())
        with watchdog:
            await self._work(stop, limits)

    async def _work(self, stop: asyncio.Event, limits: httpx.Limits) -> None:
        retention = self.retention
        alerting = retention.alerts if retention is not None and retention.alerts.webhooks else None
        if alerting is not None:
            # Before any claim loop runs: a message this worker kills is then always announced.
            await start_alerts(self.engine, alerting, self.sources)
        self._keyed = self._ordered | await keyed_sources(self.engine, self.sources)
        async with httpx.AsyncClient(limits=limits, follow_redirects=False) as http:
            self._http = http
            # Loop i waits on `_wakeups[i]`: the first ones are those that run while ingesting.
            self._wakeups = [asyncio.Event() for _ in range(self.options.concurrency)]
            loops = [
                asyncio.create_task(self._claim_loop(i, stop), name=f"claim-loop-{i}")
                for i in range(self.options.concurrency)
            ]
            side = [
                asyncio.create_task(listen_for_messages(self.url, self._notified), name="listener"),
                asyncio.create_task(self._poll(), name="poller"),
            ]
            if self.retention is not None:
                pruner = prune_periodically(self.engine, self.retention, stop, metrics=self.metrics)
                side.append(asyncio.create_task(pruner, name="pruner"))
                if alerting is not None:
                    alerts = alert_periodically(
                        self.engine, alerting, self.sources, stop, metrics=self.metrics
                    )
                    side.append(asyncio.create_task(alerts, name="dead-letter-alerts"))
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
            self._stop_lingering()
            for task in (*unfinished, *side, stopping):
                task.cancel()
            await asyncio.gather(*unfinished, *side, stopping, return_exceptions=True)
            self._http = None
        log.info("worker stopped", extra={"actor": self.actor})
        if crashed is not None:
            error = None if crashed.cancelled() else crashed.exception()
            raise WorkerCrashed(f"{crashed.get_name()} stopped: {error!r}") from error

    async def _claim_loop(self, index: int, stop: asyncio.Event) -> None:
        wake = self._wakeups[index]
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
                if index >= self._running_loops() and await self._yield(stop):
                    continue
                try:
                    if self._alone_due:
                        self._alone_due = False
                        await self.run_alone()
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
                if claimed < self.options.batch_size and not self._claim_again:
                    break
                self._claim_again = False
                self.wake_one()  # a full batch: more may be waiting, let another loop help

    async def _yield(self, stop: asyncio.Event) -> bool:
        """Ingest first: while deliveries are arriving, wait until they have stopped for
        `ingest_quiet_seconds` (or the worker stops); whether it waited."""
        wait = self._ingesting_until - asyncio.get_running_loop().time()
        if wait <= 0:
            return False
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), wait)
        return True

    async def run_batch(self) -> int:
        """Claim and run one batch of the Python handlers' sources, and one of the forwards';
        the larger number of messages claimed."""
        locked = forwarded = 0
        # Notifications linger from the batch's start (`_notified`); a look that found nothing
        # (a poll, or rows another loop took) does not hold the next delivery back.
        previous, began = self._last_batch, asyncio.get_running_loop().time()
        self._last_batch = began
        async with self._gate.shared():
            if self._free:
                locked = await self._run_handlers(Claimed(leased=False))
            if self._free_leased:
                rows = await claim_due(
                    self.engine, self._free_leased, self.options.batch_size, keyed=self._keyed
                )
                await self._run_leased(rows)
                forwarded = len(rows)
            for source in self._gated:
                forwarded = max(forwarded, await self._run_gated(source, self.options.batch_size))
        if not (locked or forwarded) and self._last_batch == began:
            self._last_batch = previous
            if self._stop_lingering():  # a notification this look was holding back
                self._notified()
        return max(locked, forwarded)

    async def run_alone(self) -> int:
        """Run the due messages whose last attempt never finished, each on its own: nothing
        else of this process is in flight meanwhile, so if it kills the process again, it
        takes only its own attempt down. The number of messages run."""
        count = 0
        async with self._gate.exclusive():
            ungated = self._free | self._free_leased
            while ungated and count < self.options.batch_size:
                rows = await claim_due(self.engine, ungated, 1, alone=True)
                if not rows:
                    break
                self._log_alone(rows)
                await self._run_leased(rows)
                count += 1
            for source in self._gated:  # as their gates admit, one at a time
                while count < self.options.batch_size and await self._run_gated(
                    source, 1, alone=True
                ):
                    count += 1
        return count

    @staticmethod
    def _log_alone(rows: list[MessageRow]) -> None:
        for row in rows:
            log.warning(
                "running alone: its last attempt never finished",
                extra={
                    "source": row.source,
                    "message_id": row.message_id,
                    "id": row.id,
                    "attempt": row.attempts + 1,
                },
            )

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.options.poll_seconds)
            self.wake_one()
            try:
                if await self.reap_expired_leases():
                    self.wake_one()
                if await alone_due(self.engine, self.sources):
                    self._alone_due = True
                    self.wake_one()
                # Keyed messages of a source this worker runs unordered (an older `serve`
                # of a rolling deploy still storing keys): claimed from their heads too.
                keyed = self._ordered | await keyed_sources(self.engine, self.sources)
                if keyed - self._keyed:
                    self.wake_one()
                self._keyed = keyed
            except Exception as exc:
                log.warning("lease reaping failed", extra={"error": f"{type(exc).__name__}: {exc}"})
            try:
                await fold_receipts(self.engine)
            except Exception as exc:
                log.warning(
                    "counting kept redeliveries failed",
                    extra={"error": f"{type(exc).__name__}: {exc}"},
                )

    async def reap_expired_leases(self) -> int:
        """Finish expired claims as unfinished attempts: retrying (run alone next), or dead when
        out of attempts. Every source's leases; the claims of Python handler batches only for
        sources not configured here, whose batches would otherwise never record them."""
        async with short_transaction(self.engine) as conn:
            leases = self._reaped(await expired_leases(conn, REAP_LIMIT))
            claims = self._reaped(
                await expired_claims_of_other_sources(conn, self.sources, REAP_LIMIT)
            )
            await finish_attempts(conn, leases, self.actor, leased=True)
            await finish_attempts(conn, claims, self.actor, leased=False)
        finished = len(leases) + len(claims)
        if finished:
            log.warning("expired claims reaped", extra={"count": finished})
        return finished
