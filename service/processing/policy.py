"""Retry policy: what a failed attempt turns into, and exponential backoff with full jitter."""

from __future__ import annotations

import random
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from service.core.config import SourceConfig
from service.processing.api import PermanentFailure, RetryLater

MAX_ERROR_CHARS = 2_000
MAX_TRACEBACK_CHARS = 8_000

# Attempt outcomes as stored in inbox_attempts.outcome.
AttemptOutcome = Literal["processed", "skipped", "failed", "retry_later", "dead", "abandoned"]
NextStatus = Literal["processed", "retrying", "dead"]


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

    status: NextStatus
    outcome: AttemptOutcome
    delay_seconds: float | None
    error_type: str
    error: str
    traceback: str | None


def describe(exc: BaseException) -> tuple[str, str, str]:
    """Type name, bounded message and bounded traceback (its innermost end) of `exc`."""
    kind = type(exc).__qualname__
    module = type(exc).__module__
    if module not in ("builtins", "__main__"):
        kind = f"{module}.{kind}"
    message = str(exc)[:MAX_ERROR_CHARS]
    tb = "".join(traceback.format_exception(exc, limit=30))[-MAX_TRACEBACK_CHARS:]
    return kind, message, tb


def classify_failure(exc: BaseException, attempt: int, config: SourceConfig) -> Failure:
    """Dead on `PermanentFailure` or the last attempt; `RetryLater`: its delay; else backoff."""
    kind, message, tb = describe(exc)
    if isinstance(exc, PermanentFailure):
        return Failure("dead", "dead", None, kind, message, tb)
    if attempt >= config.max_attempts:
        return Failure("dead", "dead", None, kind, message, tb)
    if isinstance(exc, RetryLater):
        return Failure("retrying", "retry_later", exc.after_seconds, kind, message, None)
    delay = backoff_delay(attempt, config.backoff_base_seconds, config.backoff_max_seconds)
    return Failure("retrying", "failed", delay, kind, message, tb)


def retry_failure(
    attempt: int, config: SourceConfig, error_type: str, error: str, after: float | None
) -> Failure:
    """A retryable failure without a Python exception (a forward's 503): `after` or backoff."""
    if attempt >= config.max_attempts:
        return Failure("dead", "dead", None, error_type, error[:MAX_ERROR_CHARS], None)
    delay = (
        after
        if after is not None
        else backoff_delay(attempt, config.backoff_base_seconds, config.backoff_max_seconds)
    )
    outcome: AttemptOutcome = "retry_later" if after is not None else "failed"
    return Failure("retrying", outcome, delay, error_type, error[:MAX_ERROR_CHARS], None)


def dead_failure(error_type: str, error: str) -> Failure:
    return Failure("dead", "dead", None, error_type, error[:MAX_ERROR_CHARS], None)
