"""The Grafana dashboard and Prometheus alert rules under docs/monitoring/ use only series that
`/metrics` exports (a renamed metric would leave a panel empty and an alert silent)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import asyncpg
import yaml

from tests.conftest import AppFactory
from tests.processing_helpers import deliver_until, source
from tests.prometheus_text import samples

MONITORING = Path(__file__).resolve().parents[2] / "docs" / "monitoring"
SERIES = re.compile(r"\bwebhook_inbox_[a-z_]+\b")


def dashboard_expressions() -> list[str]:
    dashboard = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    expressions = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            expressions.append(variable["definition"])
    return expressions


def alert_expressions() -> list[str]:
    rules = yaml.safe_load((MONITORING / "prometheus-alerts.yml").read_text())
    return [rule["expr"] for group in rules["groups"] for rule in group["rules"]]


def series_used() -> set[str]:
    return {
        name
        for expr in dashboard_expressions() + alert_expressions()
        for name in SERIES.findall(expr)
    }


def test_the_files_use_series_at_all() -> None:
    used = series_used()
    assert "webhook_inbox_dead_letters" in used
    assert "webhook_inbox_backlog_oldest_age_seconds" in used
    assert len(alert_expressions()) >= 5


async def test_every_series_they_use_is_exported(
    worker_for: AppFactory, db: asyncpg.Connection
) -> None:
    config = {"sources": {"hooks": source("tests.handlers:always_fail", max_attempts=1)}}
    async with worker_for(config) as client:
        await deliver_until(client, db, "m1", "dead", 10)
        exported = {name for name, _ in samples((await client.get("/metrics")).text)}
    missing = sorted(series_used() - exported)
    assert missing == [], f"not on /metrics: {missing}"
