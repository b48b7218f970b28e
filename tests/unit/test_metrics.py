"""`Metrics` on its own: what the worker's hooks count."""

from __future__ import annotations

import asyncio
import time

import pytest
from prometheus_client import generate_latest

from service.core.metrics import Metrics, observe_all
from tests.prometheus_text import samples


def test_worker_hooks_record_attempts_and_durations() -> None:
    metrics = Metrics()
    metrics.attempt_finished("hooks", "retrying", 0.2)
    metrics.attempt_finished("hooks", "processed", 0.1)
    found = samples(metrics.render().decode())
    assert (
        found[("webhook_inbox_attempts_total", (("outcome", "retrying"), ("source", "hooks")))] == 1
    )
    assert found[("webhook_inbox_handler_duration_seconds_count", (("source", "hooks"),))] == 2


def test_durations_observed_together_land_where_observed_one_by_one() -> None:
    """`observe_all` writes each bucket once by its count; the series it leaves must be the
    ones `Histogram.observe` leaves, at the bounds too (a bucket's bound is inclusive)."""
    amounts = [0.0, 0.0005, 0.001, 0.0010001, 0.003, 0.025, 0.07, 2.5, 9.99, 10.0, 11.0, 600.0]
    one_by_one, together = Metrics(), Metrics()
    for amount in amounts:
        one_by_one.ingest_duration.labels("s").observe(amount)
    observe_all(together.ingest_duration.labels("s"), amounts)

    def ingest_series(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        found = samples(metrics.render().decode())
        return {
            k: v
            for k, v in found.items()
            if k[0].startswith("webhook_inbox_ingest") and not k[0].endswith("_created")
        }

    expected, got = ingest_series(one_by_one), ingest_series(together)
    total = ("webhook_inbox_ingest_duration_seconds_sum", (("source", "s"),))
    assert expected[("webhook_inbox_ingest_duration_seconds_count", (("source", "s"),))] == 12
    assert got.pop(total) == pytest.approx(expected.pop(total))  # added in another order
    assert got == expected


async def test_deliveries_counted_in_one_turn_are_written_at_its_end() -> None:
    """Ingest's counts are held for the rest of the loop's turn, then written; a scrape in the
    same turn writes them first, so it never misses one."""
    metrics = Metrics()
    for _ in range(3):
        metrics.delivery("s", "accepted")
        metrics.ingest_finished("s", time.perf_counter())
    metrics.delivery("s", "rejected", "signature")
    accepted = (
        "webhook_inbox_deliveries_total",
        (("outcome", "accepted"), ("reason", ""), ("source", "s")),
    )
    count = ("webhook_inbox_ingest_duration_seconds_count", (("source", "s"),))

    def written() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        return samples(generate_latest(metrics.registry).decode())

    assert accepted not in written()  # held: this turn has not ended
    await asyncio.sleep(0)
    assert written()[accepted] == 3
    assert written()[count] == 3

    metrics.delivery("s", "accepted")
    assert samples(metrics.render().decode())[accepted] == 4  # a scrape writes what is held
