"""webhook-inbox: receive webhooks and push deliveries, and run their effects exactly once.

Handlers import their API from here: `InboxMessage`, `HandlerContext`, `PermanentFailure`,
`RetryLater`.
"""

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
