"""`Metrics` on its own: what the worker's hooks count."""

from __future__ import annotations

from service.core.metrics import Metrics
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
