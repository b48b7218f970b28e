"""webhook-inbox: receive webhooks and push deliveries, and run their effects exactly once.

Handlers import their API from here: `InboxMessage`, `HandlerContext`, `PermanentFailure`,
`RetryLater`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from service.processing.handler_api import (
        HandlerCommitError,
        HandlerContext,
        InboxMessage,
        PermanentFailure,
        RetryLater,
    )

__all__ = [
    "HandlerCommitError",
    "HandlerContext",
    "InboxMessage",
    "PermanentFailure",
    "RetryLater",
]


def __getattr__(name: str) -> Any:
    # The handler API is imported on first use, not with the package: every `webhook-inbox`
    # process imports `service`, and `--help`, `send` or the supervisor need no SQLAlchemy.
    if name in __all__:
        return getattr(importlib.import_module("service.processing.handler_api"), name)
    raise AttributeError(f"module 'service' has no attribute {name!r}")
