"""A readers-writer gate: batches run side by side, a message that must run alone runs alone."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class Gate:
    """Any number of `shared()` holders at once, or one `exclusive()` holder and nobody else.

    A waiting exclusive holder goes first: new shared holders wait behind it, so a message that
    must run alone is not starved by a queue that never empties.
    """

    def __init__(self) -> None:
        self._condition = asyncio.Condition()
        self._shared = 0
        self._exclusive = False
        self._exclusive_waiting = 0

    @asynccontextmanager
    async def shared(self) -> AsyncIterator[None]:
        async with self._condition:
            await self._condition.wait_for(
                lambda: not self._exclusive and not self._exclusive_waiting
            )
            self._shared += 1
        try:
            yield
        finally:
            async with self._condition:
                self._shared -= 1
                self._condition.notify_all()

    @asynccontextmanager
    async def exclusive(self) -> AsyncIterator[None]:
        async with self._condition:
            self._exclusive_waiting += 1
            try:
                await self._condition.wait_for(lambda: not self._exclusive and not self._shared)
            finally:
                self._exclusive_waiting -= 1
                self._condition.notify_all()  # if cancelled, shared holders may go on
            self._exclusive = True
        try:
            yield
        finally:
            async with self._condition:
                self._exclusive = False
                self._condition.notify_all()
