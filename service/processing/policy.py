"""Retry policy: what a failed attempt turns into, and exponential backoff with full jitter."""

from __future__ import annotations

import random
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from service.core.schema import Status
from service.processing import handler_api
from service.processing.handler_api import PermanentFailure, RetryLater
from service.sources.config import SourceConfig
from service.store.results import AttemptResult, Fingerprint

MAX_ERROR_CHARS = 2_000
MAX_TRACEBACK_CHARS = 8_000

# Attempt outcomes as stored in inbox_attempts.outcome.
AttemptOutcome = Literal["processed", "skipped", "failed", "retry_later", "dead", "abandoned"]


def backoff_delay(
    attempt: int, base: float, cap: float, rand: Callable[[], float] = random.random
) -> float:
    """Seconds before the retry after failed attempt `attempt` (1-based): full jitter.

    Uniform in [0, min(cap, base * 2**(attempt-1))], so that many messages failing together
    (a downstream outage) spread their retries out instead of returning in waves.
    """
    exponent = min(max(attempt - 1, 0), 62)
    return rand() * min(cap, base * (2.0**exponent))


@dataclass(frozen=True)
class Failure:
    """A failed attempt, classified: the next status, its delay, and what to record."""

    status: Status  # retrying or dead
    outcome: AttemptOutcome
    delay_seconds: float | None
    error_type: str
    error: str
    traceback: str | None
    # Its cause (`processing.fingerprints`), set where the failure is known in full.
    fingerprint: Fingerprint | None = None


def public_name(cls: type[BaseException]) -> str:
    """The name a reader of `last_error` knows `cls` by: the handler API's exceptions as the
    `service` package exports them (`service.PermanentFailure`), the inbox's other exceptions
    by their class name, never an internal module path; anyone else's with its module."""
    name, module = cls.__qualname__, cls.__module__
    if module in ("builtins", "__main__"):
        return name
    if module == handler_api.__name__:
        return f"service.{name}"
    if module == "service" or module.startswith("service."):
        return name
    return f"{module}.{name}"


def describe(exc: BaseException) -> tuple[str, str, str]:
    """Type name, bounded message and bounded traceback (its innermost end) of `exc`."""
    kind = public_name(type(exc))
    message = str(exc)[:MAX_ERROR_CHARS]
    tb = "".join(traceback.format_exception(exc, limit=30))[-MAX_TRACEBACK_CHARS:]
    return kind, message, tb


def classify_failure(
    exc: BaseException, attempt: int, config: SourceConfig, *, budget_start: int = 0
) -> Failure:
    """Dead on `PermanentFailure` or the last attempt; `RetryLater`: its delay; else backoff.

    `attempt` is the message's attempt number; `budget_start` the attempts it had made when its
    current budget began (an admin retry starts a fresh budget, not a fresh numbering)."""
    kind, message, tb = describe(exc)
    used = attempt - budget_start
    if isinstance(exc, PermanentFailure):
        return Failure(Status.DEAD, "dead", None, kind, message, tb)
    if used >= config.max_attempts:
        return Failure(Status.DEAD, "dead", None, kind, message, tb)
    if isinstance(exc, RetryLater):
        return Failure(Status.RETRYING, "retry_later", exc.after_seconds, kind, message, None)
    delay = backoff_delay(used, config.backoff_base_seconds, config.backoff_max_seconds)
    return Failure(Status.RETRYING, "failed", delay, kind, message, tb)


# The retry policy of a message whose source is no longer configured (its claim expired after
# the source was removed): the defaults every kind starts from.
UNCONFIGURED_POLICY = SourceConfig(kind="unconfigured")


def retry_failure(
    attempt: int,
    config: SourceConfig,
    error_type: str,
    error: str,
    after: float | None,
    *,
    budget_start: int = 0,
    abandoned: bool = False,
) -> Failure:
    """A retryable failure without a Python exception (a forward's 503, an attempt that never
    finished): retried after `after` or the backoff, dead on the budget's last attempt."""
    used = attempt - budget_start
    if used >= config.max_attempts:
        return Failure(Status.DEAD, "dead", None, error_type, error[:MAX_ERROR_CHARS], None)
    delay = (
        after
        if after is not None
        else backoff_delay(used, config.backoff_base_seconds, config.backoff_max_seconds)
    )
    outcome: AttemptOutcome = (
        "abandoned" if abandoned else "retry_later" if after is not None else "failed"
    )
    return Failure(Status.RETRYING, outcome, delay, error_type, error[:MAX_ERROR_CHARS], None)


def dead_failure(error_type: str, error: str) -> Failure:
    return Failure(Status.DEAD, "dead", None, error_type, error[:MAX_ERROR_CHARS], None)


def failed_attempt(
    message_id: int,
    attempt: int,
    failure: Failure,
    started: datetime,
    finished: datetime,
    *,
    unfinished: bool = False,
) -> AttemptResult:
    """The result to record for a failed attempt. `unfinished`: it never ended (its claim
    expired), so the message's next attempt runs alone."""
    return AttemptResult(
        message_id,
        attempt,
        failure.status,
        failure.outcome,
        started,
        finished,
        delay_seconds=failure.delay_seconds,
        error_type=failure.error_type,
        error=failure.error,
        traceback=failure.traceback,
        unfinished=unfinished,
        fingerprint=failure.fingerprint,
    )
