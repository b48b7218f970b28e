"""What the schemathesis runs over the OpenAPI share: how each operation's examples are drawn."""

from __future__ import annotations

from hypothesis import HealthCheck, settings


def schema_run_settings(max_examples: int) -> settings:
    """The same examples on every run (derandomized, no example database), with no deadline or
    health check to stop a slow app: a failure is one that any later run repeats."""
    return settings(
        max_examples=max_examples,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        derandomize=True,
        database=None,
    )
