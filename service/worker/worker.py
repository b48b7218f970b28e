"""Claim loops, the listener and the poller, supervised together, with a graceful stop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

import httpx
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from service.core.flow import BreakerState, Change
from service.core.metrics import Metrics
from service.core.schema import Status
from service.core.settings import Settings
from service.processing.attempt_spans import in_attempt_span
from service.processing.fanout import expect_gated, forward_destinations, run_destinations
from service.processing.forward import forward_message_traced, lease_seconds
from service.processing.gates import DestinationGates, breaks_circuit, probe_failed
from service.processing.handler_api import HandlerSession
from service.processing.ordering import Stopped, behind, key_of, run_in_order, runs
from service.processing.pipeline import Pipeline
from service.processing.policy import UNCONFIGURED_POLICY, failed_attempt, retry_failure
from service.processing.runner import BatchDeadline, flush_effects, handler_scope, run_handlers
from service.sources.config_file import InboxConfig
from service.store import flow
from service.store.claims import (
    RESTORE_PLANS,
    AttemptResult,
    DestinationResult,
    ExpiredLease,
    MessageRow,
    MessageSavepoints,
    alone_due,
    batch_transaction,
    claim_due,
    expired_claims_of_other_sources,
    expired_leases,
    finish_attempts,
    hold_claimed,
    keyed_sources,
    load_destinations,
    lock_due,
    record_claims,
    record_results,
    short_transaction,
)
from service.store.errors import StoreUnavailable
from service.store.flow import gate_key
from service.store.notifications import listen_for_messages
from service.store.receipts import fold_receipts
from service.worker.dead_letter_alerts import (
    alert_periodically,
    breaker_text,
    send_breaker_notice,
    start_alerts,
)
from service.worker.gate import Gate
from service.worker.retention import prune_periodically
from service.worker.watchdog import LoopWatchdog

log = logging.getLogger("service.worker")

REAP_LIMIT = 500
NEVER_FINISHED = (
    "the attempt never finished: its worker process exited or was killed, or lost the "
    "database, before recording an outcome (claim expired)"
)
MAX_ERROR_BACKOFF_SECONDS = 30.0
# After a handler of a source fails in a batch run without savepoints, that source's batches
# run with a savepoint per message for this long.
ISOLATE_AFTER_FAILURE_SECONDS = 10.0


@dataclass(frozen=True)
class WorkerOptions:
    concurrency: int = 4
    batch_size: int = 100
    poll_seconds: float = 2.0
    grace_seconds: float = 30.0
    lease_margin_seconds: float = 30.0
    linger_seconds: float = 0.05

    @classmethod
    def from_settings(cls, settings: Settings) -> WorkerOptions:
        return cls(
            concurrency=settings.worker_concurrency,
            batch_size=settings.worker_batch_size,
            poll_seconds=settings.worker_poll_seconds,
            grace_seconds=settings.worker_grace_seconds,
            lease_margin_seconds=settings.worker_lease_margin_seconds,
            linger_seconds=settings.worker_linger_seconds,
        )


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


@dataclass
class _Claimed:
    """A batch's messages, whose attempts are counted before their handlers run.

    `leased`: by `claim_due`, which leases each row (`processing` until `locked_until`): the
    messages that run alone, and forwards. Otherwise by `lock_due` and `record_claims`: the
    batch's first transaction locks its due rows and fills `rows` once their claims are
    committed; a rerun locks them again by their claims.
    """

    leased: bool
    rows: list[MessageRow] = field(default_factory=list)
    locked: bool = False  # lock_due has run (the first transaction)
    # One rate-limited source's claim: its lease, and how many its tokens allow.
    sources: dict[str, float] | None = None
    limit: int | None = None
    # The admissions of its named destinations' rate limits and breakers, made once for the
    # batch and its reruns (`service.processing.gates`).
    gates: DestinationGates | None = None
    # Of leased rows, each message's forward destinations' outcomes, made before the batch's
    # transaction began (`_run_fanout`).
    forwarded: dict[int, dict[str, DestinationResult]] | None = None


class WorkerCrashed(Exception):
    """A side task (listener, poller) or claim loop died; the worker stopped with it."""


def default_actor() -> str:
    return f"worker:{socket.gethostname()}:{os.getpid()}"


class Worker:
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
        """Wake an idle claim loop, or (all busy) the next one, which looks again when done."""
        if self._idle:
            self._idle.pop().set()
        elif self._wakeups:
            self._next = (self._next + 1) % len(self._wakeups)
            self._wakeups[self._next].set()

    def _notified(self) -> None:
        """Deliveries were committed (a NOTIFY, or the listener reconnected): wake a claim loop
        now, or, if a batch began less than `linger_seconds` ago, once that long has passed
        since it began. What ingest commits meanwhile is then claimed as one batch rather than
        as a small batch per commit, each paying a batch's round trips and statements."""
        if self._lingering is not None:
            return  # a wake is already due
        loop = asyncio.get_running_loop()
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
        self._keyed |= await keyed_sources(self.engine, self.sources)
        async with httpx.AsyncClient(limits=limits, follow_redirects=False) as http:
            self._http = http
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
                locked = await self._run_handlers(_Claimed(leased=False))
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

    async def _run_gated(self, source: str, want: int, *, alone: bool = False) -> int:
        """Claim and run as many of `source`'s due messages (of `want`) as its gates admit now
        (`core.flow.admit`: its circuit breaker, then its rate limit's bucket, shared by every
        process on the database), then settle: tokens not used go back, and a forward's
        outcomes move its breaker. The number claimed. A message over the limit or held by
        an open breaker waits as it is, no attempt spent, and a wake-up is set for when it
        may run. A probe that fails is the breaker's, not its message's: its attempt is given
        back (`_forward`). `alone`: among the messages whose last attempt never finished.
        """
        pipeline, gates = self.pipelines[source], self._gates[source]
        leases = {source: self._leases[source]}
        key = gate_key(source)
        admission = await flow.admit(self.engine, key, gates, want, leases[source])
        if not admission.allowed:
            if self._gated_backlog[source] and not alone:
                self._wake_later(admission.wait_seconds)
                if self.metrics is not None and admission.breaker in (None, BreakerState.CLOSED):
                    self.metrics.rate_limit_waited(source, admission.wait_seconds)
            return 0
        failed: list[AttemptResult] = []
        succeeded = 0
        if source not in self._leased and not alone:
            limit = admission.allowed
            claimed = await self._run_handlers(_Claimed(leased=False, sources=leases, limit=limit))
        else:
            rows = await claim_due(
                self.engine, leases, admission.allowed, alone=alone, keyed=self._keyed
            )
            claimed = len(rows)
            if alone:
                self._log_alone(rows)
            if rows and pipeline.forward is None:
                await self._run_leased(rows)
            elif rows:
                probe = gates.cooldown_seconds if admission.probe else None
                results = await self._forward(rows, failed_probe_waits=probe)
                failed = [r for r in results if breaks_circuit(r.status, r.error_type, r.error)]
                succeeded = sum(r.status == Status.PROCESSED for r in results)
        if self.metrics is not None and claimed and gates.per_second is not None:
            self.metrics.rate_limit_claimed(source, claimed)
        error = failed[-1].error if failed else None
        outcomes = flow.Outcomes(admission, claimed, len(failed), succeeded, error)
        change = await flow.settle(self.engine, key, gates, outcomes)
        if change is not None:
            self._breaker_changed(source, change, error, gates.cooldown_seconds)
        if alone:
            return claimed
        # Claimed all it was admitted: more may be due, once the gates let them.
        self._gated_backlog[source] = claimed == admission.allowed
        if claimed == admission.allowed and admission.allowed < want:
            if admission.wait_seconds:
                self._wake_later(admission.wait_seconds)
            else:
                self._claim_again = True  # capped by the breaker, not by the backlog
        return claimed

    def _breaker_changed(
        self, source: str, change: Change, error: str | None, cooldown: float, destination: str = ""
    ) -> None:
        """A forward's breaker (the source's own, or a named `destination`'s) changed: count it;
        when it opened, log and announce it; while open, look again when its cool-down ends."""
        if self.metrics is not None:
            self.metrics.breaker_changed(source, change, destination)
        if change != "closed":
            self._wake_later(cooldown)
        if change != "opened":
            return
        log.warning(
            "circuit opened: the forward is left alone for its cool-down",
            extra={
                "source": source,
                "destination": destination or None,
                "cooldown_s": cooldown,
                "error": error,
            },
        )
        self._announce_breaker(source, error, cooldown, destination)

    def _announce_breaker(
        self, source: str, error: str | None, cooldown: float, destination: str = ""
    ) -> None:
        """Tell the `[alerts]` webhooks that a forward's circuit opened (this process opened
        it: one notice per opening), in a task of its own, so no claim waits for the webhook."""
        alerts = self.retention.alerts if self.retention is not None else None
        if alerts is None or not alerts.webhooks or self._http is None:
            return
        text = breaker_text(source, error, cooldown, destination)
        fields: dict[str, object] = {"source": source, "error": error, "cooldown_seconds": cooldown}
        if destination:
            fields["destination"] = destination
        task = asyncio.create_task(send_breaker_notice(self._http, alerts, text, fields))
        self._notices.add(task)
        task.add_done_callback(self._notices.discard)

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

    def _wake_later(self, seconds: float) -> None:
        asyncio.get_running_loop().call_later(max(seconds, 0.001), self.wake_one)

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

    async def _run_leased(self, rows: list[MessageRow]) -> None:
        """Run leased rows of Python handlers' sources, or of sources whose named destinations
        forward (`_run_fanout`); a source's own forward goes by `_forward`."""
        fanning = [row for row in rows if self.pipelines[row.source].forwards_in_batch]
        handled = [row for row in rows if row not in fanning]
        if handled:
            await self._run_handlers(_Claimed(leased=True, rows=handled))
        if fanning:
            await self._run_fanout(fanning)

    async def _run_fanout(self, rows: list[MessageRow]) -> None:
        """Leased messages whose named destinations forward: first their forwards, called with
        no transaction open (as a source's forward is), then one transaction that runs their
        handler destinations and records every destination's outcome, the forwards' with
        them. A key's messages after the first of this batch are put back unattempted: a
        forward of a later one must not go out before an earlier one's handlers commit."""
        first: dict[tuple[str, str], MessageRow] = {}
        behind_first: list[MessageRow] = []
        for row in rows:
            key = key_of(row)
            if key is not None and first.setdefault(key, row) is not row:
                behind_first.append(row)
        if behind_first:
            await record_results(
                self.engine, [behind(row) for row in behind_first], self.actor, leased=True
            )
        rows = [row for row in rows if row not in behind_first]
        async with short_transaction(self.engine) as conn:
            await load_destinations(conn, rows)
        gates = None
        if any(self.pipelines[row.source].gated for row in rows):
            gates = DestinationGates(self.engine, self.pipelines)
            for row in rows:
                expect_gated(gates, self.pipelines[row.source], row)
        assert self._http is not None
        http = self._http
        made = await asyncio.gather(
            *(forward_destinations(self.pipelines[row.source], row, http, gates) for row in rows)
        )
        forwarded = {row.id: outcomes for row, outcomes in zip(rows, made, strict=True)}
        await self._run_handlers(_Claimed(leased=True, rows=rows, gates=gates, forwarded=forwarded))

    async def _run_handlers(self, claimed: _Claimed) -> int:
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

    async def _run_optimistically(self, claimed: _Claimed) -> int:
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
        self, conn: AsyncConnection, claimed: _Claimed
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
        return failed_attempt(message, attempt, failure, now, now, unfinished=True)

    async def _run_batch(
        self,
        claimed: _Claimed,
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

    async def _end_attempts(self, claimed: _Claimed, exc: Exception) -> None:
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
                retry_failure(
                    row.attempts + 1,
                    self.pipelines[row.source].config,
                    "TransactionFailed",
                    error,
                    None,
                    budget_start=row.budget_start,
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

    async def _forward(
        self, rows: list[MessageRow], *, failed_probe_waits: float | None = None
    ) -> list[AttemptResult]:
        """Forward `rows` (leased) and record their outcomes; the outcomes as forwarded.
        `failed_probe_waits`: the rows are a breaker's probe, and one that fails as the
        breaker counts failures gives its attempt back and waits this long (`probe_failed`)."""
        assert self._http is not None
        http = self._http

        async def forward(row: MessageRow) -> AttemptResult:
            config = self.pipelines[row.source].config
            return await forward_message_traced(http, row, row.attempts + 1, config)

        # Each key's run in order, the keys and the unkeyed messages concurrently.
        ran = await asyncio.gather(*(run_in_order(run, forward) for run in runs(rows)))
        results = [result for run in ran for result in run]
        kept = results
        if failed_probe_waits is not None:
            kept = [probe_failed(r, failed_probe_waits, rows) for r in results]
        recorded = await record_results(self.engine, kept, self.actor, leased=True)
        if self._ordered and any(row.source in self._ordered for row in rows):
            self._claim_again = True
        self._count(rows, [r for r in kept if r.id in recorded])
        for result in results:
            if result.id not in recorded:
                log.warning(
                    "forward outcome dropped: the lease expired and another attempt took over",
                    extra={"id": result.id, "attempt": result.attempt},
                )
        return list(results)

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
