"""Prometheus metrics: one registry per app, so each test's app counts alone; under `serve`,
every process writes its counters to a shared directory and `/metrics` sums them all."""

from __future__ import annotations

import asyncio
import bisect
import math
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from service.core.schema import Status

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Ingest answers in milliseconds; the top buckets catch a database that has started to stall.
INGEST_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
HANDLER_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

# Set by `serve` for its children (prometheus_client reads it when it is imported): each
# process's counters go to files there, and any HTTP process's `/metrics` adds them up.
MULTIPROCESS_ENV = "PROMETHEUS_MULTIPROC_DIR"

# The `source` label of a delivery to a name that is not configured: anyone can send those, and
# a label per made-up name would grow the registry without bound.
UNKNOWN_SOURCE = ""


def follow_multiprocess_environment() -> None:
    """Make the metrics created from now on follow `MULTIPROCESS_ENV` as it is set now.

    prometheus_client reads it once, when it is imported; a child forked by `serve` finds it
    imported by the supervisor, which runs without it.
    """
    from prometheus_client import values

    values.ValueClass = values.get_value_class()  # type: ignore[no-untyped-call]


@dataclass(frozen=True)
class InboxSnapshot:
    """The inbox as the database saw it at one moment: counts and the oldest unfinished age."""

    counts: Mapping[tuple[str, str], int] = field(default_factory=dict)  # (source, status) -> n
    oldest_pending_age_seconds: float | None = None
    # Per source: the oldest unfinished message's age, and the dead letters (0 for a
    # configured source with none, so that alert rules see the series before the first).
    backlog_age_seconds: Mapping[str, float] = field(default_factory=dict)
    dead_letters: Mapping[str, int] = field(default_factory=dict)
    # The catch-up (`/admin/stats`' fields of the same names): None, the series omitted.
    backlog: int = 0
    drain_rate_per_second: float = 0.0
    arrival_rate_per_second: float = 0.0
    catch_up_seconds: float | None = None
    # Per broker source, the messages waiting on the broker as its freshest consumer last
    # read them (`inbox_consumers`); a source whose broker does not say is left out.
    consumer_lag: Mapping[str, int] = field(default_factory=dict)
    # Issues (`inbox_issues`) by (source, status), and by (fingerprint, source) the failed
    # attempts of the 100 most recently failing open or acknowledged ones.
    issues: Mapping[tuple[str, str], int] = field(default_factory=dict)
    issue_failed_attempts: Mapping[tuple[str, str], int] = field(default_factory=dict)


class _InboxCollector(Collector):
    """Exposes the last snapshot the `/metrics` route read from the database."""

    def __init__(self) -> None:
        self.snapshot: InboxSnapshot | None = None

    def collect(self) -> Iterable[Metric]:
        snapshot = self.snapshot
        if snapshot is None:
            return []
        messages = GaugeMetricFamily(
            "webhook_inbox_messages",
            "Messages in the inbox by source and status, read from the database at scrape time.",
            labels=["source", "status"],
        )
        for (source, status), count in sorted(snapshot.counts.items()):
            messages.add_metric([source, status], count)
        oldest = GaugeMetricFamily(
            "webhook_inbox_oldest_pending_age_seconds",
            "Age of the oldest message not yet finished (pending, retrying or processing); "
            "0 when there is none.",
            value=snapshot.oldest_pending_age_seconds or 0.0,
        )
        backlog = GaugeMetricFamily(
            "webhook_inbox_backlog_oldest_age_seconds",
            "Per source, the age of its oldest message not yet finished (pending, retrying or "
            "processing); 0 when there is none.",
            labels=["source"],
        )
        for source, age in sorted(snapshot.backlog_age_seconds.items()):
            backlog.add_metric([source], age)
        dead = GaugeMetricFamily(
            "webhook_inbox_dead_letters",
            "Per source, the messages in the dead-letter list (status dead).",
            labels=["source"],
        )
        for source, count in sorted(snapshot.dead_letters.items()):
            dead.add_metric([source], count)
        catching_up = [
            GaugeMetricFamily(
                "webhook_inbox_backlog_messages",
                "Messages not yet finished (pending, retrying or processing).",
                value=snapshot.backlog,
            ),
            GaugeMetricFamily(
                "webhook_inbox_drain_rate_per_second",
                "Messages the workers finished well per second, over the last 10 seconds.",
                value=snapshot.drain_rate_per_second,
            ),
            GaugeMetricFamily(
                "webhook_inbox_arrival_rate_per_second",
                "New messages received per second, over the last 10 seconds.",
                value=snapshot.arrival_rate_per_second,
            ),
            GaugeMetricFamily(
                "webhook_inbox_catch_up_seconds",
                "Estimated seconds to work off the backlog (backlog over drain less arrival "
                "rate); 0 with no backlog, +Inf while it is not shrinking.",
                value=math.inf if snapshot.catch_up_seconds is None else snapshot.catch_up_seconds,
            ),
        ]
        lag = GaugeMetricFamily(
            "webhook_inbox_consumer_lag",
            "Per broker source, the messages waiting on the broker, as its freshest consumer "
            "last read them (at most every 5 s), read from the database at scrape time.",
            labels=["source"],
        )
        for source, waiting in sorted(snapshot.consumer_lag.items()):
            lag.add_metric([source], waiting)
        issues = GaugeMetricFamily(
            "webhook_inbox_issues",
            "Issues (failures grouped by cause) by source and status, read from the database at "
            "scrape time.",
            labels=["source", "status"],
        )
        for (source, status), count in sorted(snapshot.issues.items()):
            issues.add_metric([source, status], count)
        failed = GaugeMetricFamily(
            "webhook_inbox_issue_failed_attempts",
            "Failed attempts of each open or acknowledged issue, the 100 most recently failing "
            "only (a bound on the series), read from the database at scrape time.",
            labels=["fingerprint", "source"],
        )
        for (fingerprint, source), count in sorted(snapshot.issue_failed_attempts.items()):
            failed.add_metric([fingerprint, source], count)
        return [messages, oldest, backlog, dead, *catching_up, lag, issues, failed]


_Labelled = TypeVar("_Labelled", Counter, Histogram)


def _child(cache: dict[tuple[str, ...], _Labelled], metric: _Labelled, *values: str) -> _Labelled:
    """`metric.labels(*values)`, looked up once and kept in `cache`."""
    child = cache.get(values)
    if child is None:
        child = cache[values] = metric.labels(*values)
    return child


def observe_all(histogram: Histogram, amounts: Iterable[float]) -> None:
    """`histogram.observe(amount)` for each of `amounts`, writing each value it changes once:
    its sum, and each bucket by the number of amounts that fall in it. (Under `serve` every
    write of a value is a locked write to a shared file; the bucket an amount falls in is the
    first whose upper bound is not below it, as `observe` finds it.)"""
    bounds = histogram._upper_bounds
    counts: dict[int, int] = {}
    total = 0.0
    for amount in amounts:
        index = bisect.bisect_left(bounds, amount)
        counts[index] = counts.get(index, 0) + 1
        total += amount
    histogram._sum.inc(total)
    for index, count in counts.items():
        histogram._buckets[index].inc(count)


class Metrics:
    """Every series the service exposes, registered in a registry of its own."""

    def __init__(self, sources: Iterable[str] = ()) -> None:
        self.registry = CollectorRegistry()
        self.snapshot_read_at: float | None = None
        self.shared_dir = os.environ.get(MULTIPROCESS_ENV)
        if self.shared_dir is None:
            # One process: its own process_* and python_* series. (Under `serve` they would
            # describe whichever process answered the scrape, so they are left out.)
            ProcessCollector(registry=self.registry)
            PlatformCollector(registry=self.registry)
            GCCollector(registry=self.registry)
        self.deliveries = Counter(
            "webhook_inbox_deliveries",
            "Messages and requests received, by source and outcome (accepted, duplicate, "
            "processed, rejected, handshake, unavailable); `reason` says why one was rejected.",
            ["source", "outcome", "reason"],
            registry=self.registry,
        )
        self.ingest_duration = Histogram(
            "webhook_inbox_ingest_duration_seconds",
            "Time from receiving a delivery's request to answering it, by source.",
            ["source"],
            buckets=INGEST_BUCKETS,
            registry=self.registry,
        )
        self.attempts = Counter(
            "webhook_inbox_attempts",
            "Processing attempts finished by the worker, by source and outcome.",
            ["source", "outcome"],
            registry=self.registry,
        )
        self.destination_attempts = Counter(
            "webhook_inbox_destination_attempts",
            "Of sources with named destinations: each destination's part of the worker's "
            "attempts, by source, destination and outcome (processed, skipped, failed, "
            "retry_later, dead).",
            ["source", "destination", "outcome"],
            registry=self.registry,
        )
        self.rate_limited_claims = Counter(
            "webhook_inbox_rate_limit_claimed",
            "Messages run within their rate_limit, by source and destination (empty for the "
            "source's own limit; else a named destination's): its rate() is the current rate.",
            ["source", "destination"],
            registry=self.registry,
        )
        self.rate_limit_waits = Counter(
            "webhook_inbox_rate_limit_wait_seconds",
            "Time rate-limited backlogs waited for their bucket to refill, by source and "
            "destination (empty for the source's own limit; summed over the workers' waits): "
            "above zero, the limit is what holds them.",
            ["source", "destination"],
            registry=self.registry,
        )
        self.consumer_messages = Counter(
            "webhook_inbox_consumer_messages",
            "Broker messages settled by the consumers, by source and outcome: accepted and "
            "duplicate (acked after their commit), dead_lettered (moved to the broker's dead "
            "letters), released (handed back unrecorded), ack_lost (recorded, the ack lost with "
            "the connection: redelivered as a duplicate).",
            ["source", "outcome"],
            registry=self.registry,
        )
        self.consumer_connections = Gauge(
            "webhook_inbox_consumer_connected",
            "1 while a consumer process of the broker source is connected and subscribed.",
            ["source"],
            registry=self.registry,
            multiprocess_mode="livemax",
        )
        self.breaker_transitions = Counter(
            "webhook_inbox_breaker_transitions",
            "Circuit breaker changes of forwards, by source, destination (empty for the "
            "source's own forward; else a named destination's) and change: opened (after "
            "breaker_failures failures in a row), reopened (a probe failed), closed (a probe "
            "succeeded).",
            ["source", "destination", "change"],
            registry=self.registry,
        )
        self.handler_duration = Histogram(
            "webhook_inbox_handler_duration_seconds",
            "Time one processing attempt spent in the source's handlers or forwarding.",
            ["source"],
            buckets=HANDLER_BUCKETS,
            registry=self.registry,
        )
        self.pruned_rows = Counter(
            "webhook_inbox_pruned_rows",
            "Inbox rows deleted by retention, by the status they had.",
            ["status"],
            registry=self.registry,
        )
        self.admin_actions = Counter(
            "webhook_inbox_admin_actions",
            "Admin state changes (retry, replay, discard), counted per message.",
            ["action"],
            registry=self.registry,
        )
        self.alert_notices = Counter(
            "webhook_inbox_alert_notices",
            "Dead-letter alert notices ([alerts] webhooks), by outcome: sent, or failed (every "
            "try of a pass failed; the notice is tried again after the interval).",
            ["outcome"],
            registry=self.registry,
        )
        self.ingest_rewrites = Counter(
            "webhook_inbox_ingest_batches_rewritten",
            "Group-commit batches written a second time because their plain INSERT met a "
            "message already stored (a redelivery); each left one failed statement, a "
            "unique violation, in PostgreSQL's log.",
            registry=self.registry,
        )
        self.ingest_kept_aside = Counter(
            "webhook_inbox_ingest_redeliveries_kept_aside",
            "Redelivered messages (each once a group-commit batch) whose row a running batch of "
            "handlers held past the group commit's lock wait: answered at once and kept in "
            "inbox_receipts, then added to the row's receive_count by the worker's next poll "
            "once that batch has ended.",
            registry=self.registry,
        )
        self.rejections_unrecorded = Counter(
            "webhook_inbox_rejections_unrecorded",
            "Refused deliveries not kept in inbox_rejected_deliveries: pushed out by newer "
            "ones of their source before they were written (a flood), or lost with a write "
            "that failed.",
            ["source"],
            registry=self.registry,
        )
        self._delivery_counters: dict[tuple[str, ...], Counter] = {}
        self._ingest_histograms: dict[tuple[str, ...], Histogram] = {}
        # Ingest's counts and durations of the current turn of the event loop, written at its
        # end (`write_held`).
        self._held_deliveries: dict[tuple[str, str, str], int] = {}
        self._held_durations: dict[str, list[float]] = {}
        self._write_scheduled = False
        self._attempt_counters: dict[tuple[str, ...], Counter] = {}
        self._handler_histograms: dict[tuple[str, ...], Histogram] = {}
        self._inbox = _InboxCollector()
        self.registry.register(self._inbox)
        self._exposed = self.registry
        if self.shared_dir is not None:
            # Scrapes read every process's files (HTTP and processing, live and dead: a
            # counter must not go back when a child is restarted), plus the database gauges.
            self._exposed = CollectorRegistry()
            MultiProcessCollector(self._exposed, path=self.shared_dir)  # type: ignore[no-untyped-call]
            self._exposed.register(self._inbox)
        # Series that exist from the start, at zero, so that rate() and alerts see them before
        # the first event rather than appearing out of nowhere.
        for source in sources:
            self.ingest_duration.labels(source)
            self.handler_duration.labels(source)
        for status in (Status.PROCESSED, Status.DISCARDED, Status.DEAD):
            self.pruned_rows.labels(status)
        for action in ("admin_retry", "admin_replay", "admin_discard"):
            self.admin_actions.labels(action)
        for outcome in ("sent", "failed"):
            self.alert_notices.labels(outcome)

    # The hot series' children by label values, looked up once: `labels()` checks and locks
    # on every call, and ingest counts two series per delivery. The label values are bounded
    # (configured sources, a closed set of outcomes and reasons), and so are these dicts.
    #
    # Ingest counts a delivery and times its request for every one it answers, and a group
    # commit answers tens in one turn of the event loop. Each series' value is then written
    # once at the end of the turn, by the number of deliveries it counted, instead of once
    # per delivery: under `serve` every write is a locked write to a shared file. Three of them
    # a delivery cost 7.5 us of CPU; held, at 12 deliveries a turn, 2.6 (docs/benchmarks-log.md).
    # A scrape writes what is held first; another process's scrape sees it at the end of this
    # turn.

    def delivery(self, source: str, outcome: str, reason: str = "") -> None:
        key = (source, outcome, reason)
        held = self._held_deliveries
        held[key] = held.get(key, 0) + 1
        self._hold()

    def ingest_finished(self, source: str, started: float) -> None:
        """Observe one ingest request that began at `time.perf_counter()` value `started`."""
        duration = time.perf_counter() - started
        held = self._held_durations.get(source)
        if held is None:
            self._held_durations[source] = [duration]
        else:
            held.append(duration)
        self._hold()

    def _hold(self) -> None:
        """Write what is held at the end of this turn of the event loop (now, off a loop)."""
        if self._write_scheduled:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.write_held()
            return
        self._write_scheduled = True
        loop.call_soon(self.write_held)

    def write_held(self) -> None:
        """Add the held deliveries and durations to their series."""
        self._write_scheduled = False
        deliveries, self._held_deliveries = self._held_deliveries, {}
        for (source, outcome, reason), count in deliveries.items():
            _child(self._delivery_counters, self.deliveries, source, outcome, reason).inc(count)
        durations, self._held_durations = self._held_durations, {}
        for source, amounts in durations.items():
            observe_all(_child(self._ingest_histograms, self.ingest_duration, source), amounts)

    def ingest_batch_rewritten(self) -> None:
        """A group-commit batch met a stored key and was written again counting it."""
        self.ingest_rewrites.inc()

    def ingest_redeliveries_kept_aside(self, count: int) -> None:
        """`count` redeliveries met their rows held and were kept in inbox_receipts."""
        self.ingest_kept_aside.inc(count)

    def attempt_finished(self, source: str, outcome: str, duration_seconds: float) -> None:
        """For the worker: one attempt ended with `outcome` after `duration_seconds`."""
        _child(self._attempt_counters, self.attempts, source, outcome).inc()
        _child(self._handler_histograms, self.handler_duration, source).observe(duration_seconds)

    def destination_finished(self, source: str, destination: str, outcome: str) -> None:
        """For the worker: one destination's part of an attempt ended with `outcome`."""
        _child(
            self._attempt_counters, self.destination_attempts, source, destination, outcome
        ).inc()

    def consumer_message(self, source: str, outcome: str) -> None:
        self.consumer_messages.labels(source, outcome).inc()

    def consumer_connected(self, source: str, connected: bool) -> None:
        self.consumer_connections.labels(source).set(1 if connected else 0)

    def rate_limit_claimed(self, source: str, count: int, destination: str = "") -> None:
        self.rate_limited_claims.labels(source, destination).inc(count)

    def rate_limit_waited(self, source: str, seconds: float, destination: str = "") -> None:
        self.rate_limit_waits.labels(source, destination).inc(seconds)

    def breaker_changed(self, source: str, change: str, destination: str = "") -> None:
        self.breaker_transitions.labels(source, destination, change).inc()

    def pruned(self, by_status: Mapping[str, int]) -> None:
        for status, count in by_status.items():
            if count:
                self.pruned_rows.labels(status).inc(count)

    def set_inbox_snapshot(self, snapshot: InboxSnapshot | None) -> None:
        self._inbox.snapshot = snapshot
        self.snapshot_read_at = time.monotonic()

    def snapshot_is_fresh(self, max_age_seconds: float) -> bool:
        """Whether the last snapshot read from the database is recent enough to serve again."""
        return (
            self._inbox.snapshot is not None
            and self.snapshot_read_at is not None
            and time.monotonic() - self.snapshot_read_at < max_age_seconds
        )

    def render(self) -> bytes:
        self.write_held()
        return generate_latest(self._exposed)
