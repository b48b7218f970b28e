"""Handlers the console's browser tests configure: a billing handler whose downstream is "down"
while a flag file exists, so a test can fail a message, fix the cause, and retry it."""

from __future__ import annotations

import os
from pathlib import Path

from service import HandlerContext, InboxMessage
from tests.handlers import record

# The flag file's path; `serve` hands its environment to the processing processes.
DOWN_FLAG_ENV = "CONSOLE_TEST_BILLING_DOWN"


class BillingUnavailable(ConnectionError):
    """The downstream the handler calls is not answering."""


async def billing(message: InboxMessage, ctx: HandlerContext) -> None:
    """Records an effect, unless billing is down or the payload's amount is negative."""
    flag = os.environ.get(DOWN_FLAG_ENV)
    if flag and Path(flag).exists():
        raise BillingUnavailable(f"billing API refused the connection for {message.message_id}")
    payload = message.payload if isinstance(message.payload, dict) else {}
    amount = (
        payload.get("data", {}).get("amount", 0) if isinstance(payload.get("data"), dict) else 0
    )
    if isinstance(amount, int) and amount < 0:
        raise ValueError(f"amount must not be negative, got {amount}")
    await record(message, ctx)
