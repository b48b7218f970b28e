"""A consumer process's row per source in `inbox_consumers`: written every 5 s and on each
change of state, the broker's lag asked at most every 5 s, deleted on a clean stop.

Best effort: the rows are for operators (readyz, the admin, the metrics), so a write that
fails (the database away) is logged and tried again at the next change or period, and never
holds up the messages.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Sequence

from sqlalchemy.ext.asyncio import AsyncEngine

from service.consumers.runner import SourceConsumer
from service.store.consumers import (
    REPORT_SECONDS,
    ConsumerReport,
    forget_consumers,
    report_consumers,
)

log = logging.getLogger("service.consumers")

# A write or a lag question that takes longer is given up until the next round: the database
# or the broker is too slow to answer, and the consumers must not wait for it.
CALL_TIMEOUT_SECONDS = 3.0


def process_name() -> str:
    """This process, as its rows name it."""
    return f"{socket.gethostname()}:{os.getpid()}"


class ConsumerReporter:
    """Writes `consumers`' rows until `run` is cancelled or `stop` is set, then deletes them."""

    def __init__(
        self, engine: AsyncEngine, consumers: Sequence[SourceConsumer], stop: asyncio.Event
    ) -> None:
        self.engine = engine
        self.consumers = list(consumers)
        self.stop = stop
        self.name = process_name()
        self._lag_read_at = dict.fromkeys(range(len(self.consumers)), -REPORT_SECONDS)
        self._failing = False

    async def run(self) -> None:
        """Report until `stop`, then once more (the consumers' last state is written by
        `forget`, which the caller awaits once they have settled)."""
        while not self.stop.is_set():
            for consumer in self.consumers:
                consumer.changed.clear()
            await self.report()
            await self._next_change()

    async def _next_change(self) -> None:
        waits = [asyncio.ensure_future(c.changed.wait()) for c in self.consumers]
        waits.append(asyncio.ensure_future(self.stop.wait()))
        try:
            await asyncio.wait(waits, timeout=REPORT_SECONDS, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()

    async def report(self) -> None:
        for index, consumer in enumerate(self.consumers):
            await self._refresh_lag(index, consumer)
        reports = [
            ConsumerReport(
                source=c.source.name,
                consumer=self.name,
                connected=c.status.connected,
                state=c.status.state,
                last_error=c.status.last_error,
                lag=c.status.lag,
                counts=dict(c.status.counts),
            )
            for c in self.consumers
        ]
        try:
            await asyncio.wait_for(report_consumers(self.engine, reports), CALL_TIMEOUT_SECONDS)
        except Exception as exc:  # the database away: the next round tries again
            if not self._failing:
                log.warning(
                    "consumer state not written; trying again",
                    extra={"consumer": self.name, "error": f"{type(exc).__name__}: {exc}"},
                )
            self._failing = True
            return
        self._failing = False

    async def _refresh_lag(self, index: int, consumer: SourceConsumer) -> None:
        now = time.monotonic()
        client = consumer.client
        if client is None or now - self._lag_read_at[index] < REPORT_SECONDS:
            return
        self._lag_read_at[index] = now
        try:
            consumer.status.lag = await asyncio.wait_for(client.lag(), CALL_TIMEOUT_SECONDS)
        except Exception as exc:  # best effort: the last lag read stands
            log.debug(
                "broker lag not read",
                extra={"source": consumer.source.name, "error": f"{type(exc).__name__}: {exc}"},
            )

    async def forget(self) -> None:
        """Delete this process's rows: it stopped cleanly."""
        names = [c.source.name for c in self.consumers]
        with contextlib.suppress(Exception):
            await asyncio.wait_for(
                forget_consumers(self.engine, names, self.name), CALL_TIMEOUT_SECONDS
            )
