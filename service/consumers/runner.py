"""One source's consumer: connect, take messages, record each through ingest's group commit,
and settle it on the broker only once its fate is committed; reconnect when the broker goes.

The promise (docs/guarantees.md): a message is acked only after the COMMIT that holds its row
(a redelivery's duplicate is counted by that COMMIT too), so a crash at any moment leaves it
either recorded or on the broker, never neither. While the database is away nothing is acked:
each message waits, unsettled, its recording tried again with backoff, and once `prefetch`
wait the broker sends no more. A message that can never be recorded (no id where the source
says it is, too large, refused by the database) is moved to the broker's dead letters with
why, never acked silently.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from service.consumers.base import BrokerClient, BrokerMessage
from service.core.metrics import Metrics
from service.sources.base import Rejected
from service.sources.brokers import BrokerSource
from service.store.errors import StoreOverloaded, StoreRefused, StoreUnavailable
from service.store.group_commit import GroupCommitter

log = logging.getLogger("service.consumers")

FIRST_RETRY_SECONDS = 0.5
MAX_RETRY_SECONDS = 30.0


@dataclass
class ConsumerState:
    """What an operator is told of a consumer (`inbox_consumers`, readyz, the admin)."""

    connected: bool = False
    state: str = "starting"
    last_error: str | None = None
    lag: int | None = None
    counts: dict[str, int] = field(default_factory=dict)

    def count(self, outcome: str) -> None:
        self.counts[outcome] = self.counts.get(outcome, 0) + 1


class SourceConsumer:
    """Consumes one broker source until `stop` is set, then settles what it holds."""

    def __init__(
        self,
        source: BrokerSource,
        client_factory: Callable[[BrokerSource], BrokerClient],
        committer: GroupCommitter,
        stop: asyncio.Event,
        *,
        has_work: bool,
        searchable: bool = False,
        max_body_bytes: int,
        metrics: Metrics | None = None,
    ) -> None:
        self.source = source
        self.client_factory = client_factory
        self.committer = committer
        self.stop = stop
        self.has_work = has_work
        self.searchable = searchable
        self.max_body_bytes = max_body_bytes
        self.metrics = metrics
        self.status = ConsumerState()
        # Set on each change of `status.state`: its reporter writes the row at once.
        self.changed = asyncio.Event()
        # The connection in use, for the reporter to ask the broker's lag.
        self.client: BrokerClient | None = None
        self._held: set[asyncio.Task[None]] = set()
        self._room = asyncio.Semaphore(source.config.prefetch)

    async def run(self) -> None:
        """Connect, consume, and reconnect with backoff (doubling to 30 s) until stopped."""
        delay = FIRST_RETRY_SECONDS
        while not self.stop.is_set():
            client = self.client_factory(self.source)
            try:
                self._set_state("connecting")
                await client.connect()
                self.client = client
                self._connected(True, None)
                delay = FIRST_RETRY_SECONDS
                await self._consume(client)
            except Exception as exc:  # the broker went away, or refused us
                self._connected(False, f"{type(exc).__name__}: {exc}")
                log.warning(
                    "consumer disconnected; reconnecting",
                    extra={
                        "source": self.source.name,
                        "error": self.status.last_error,
                        "retry_in_s": delay,
                    },
                )
            finally:
                self.client = None
                await self._settle_held()
                with contextlib.suppress(Exception):
                    await client.close()
            if self.stop.is_set():
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), timeout=delay)
            delay = min(delay * 2, MAX_RETRY_SECONDS)
        self._connected(False, None)
        self._set_state("stopped")

    def _set_state(self, state: str) -> None:
        if state != self.status.state:
            self.status.state = state
            self.changed.set()

    def _connected(self, connected: bool, error: str | None) -> None:
        self.status.connected = connected
        if error is not None or connected:
            self.status.last_error = error
        self._set_state("connected" if connected else "disconnected")
        self.changed.set()
        if self.metrics is not None:
            self.metrics.consumer_connected(self.source.name, connected)

    async def _consume(self, client: BrokerClient) -> None:
        stopping = asyncio.ensure_future(self.stop.wait())
        messages = client.messages().__aiter__()
        try:
            while True:
                # Room for one more unsettled message, unless stopping first (with every
                # room held, say while the database is away, only the stop ends the wait).
                room = asyncio.ensure_future(self._room.acquire())
                await asyncio.wait({room, stopping}, return_when=asyncio.FIRST_COMPLETED)
                if not room.done():
                    room.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await room
                    if not room.cancelled():
                        self._room.release()
                    return
                taking = asyncio.ensure_future(anext(messages))
                done, _ = await asyncio.wait(
                    {taking, stopping}, return_when=asyncio.FIRST_COMPLETED
                )
                if taking not in done:
                    taking.cancel()
                    self._room.release()
                    with contextlib.suppress(BaseException):
                        await taking
                    return
                try:
                    message = taking.result()
                except BaseException as exc:
                    # The room taken for a message that never came: given back, or each
                    # reconnection would leave the consumer one message of prefetch short.
                    self._room.release()
                    if isinstance(exc, StopAsyncIteration):
                        raise ConnectionError("the broker ended the subscription") from None
                    raise
                task = asyncio.create_task(self._take(message))
                self._held.add(task)
                task.add_done_callback(self._held.discard)
                task.add_done_callback(lambda _: self._room.release())
        finally:
            stopping.cancel()

    async def _settle_held(self) -> None:
        """Wait for the messages taken: each is acked, dead-lettered, or handed back."""
        if self._held:
            await asyncio.gather(*self._held, return_exceptions=True)

    async def _take(self, message: BrokerMessage) -> None:
        """Record one message, then settle it on the broker."""
        name = self.source.name
        try:
            identified = self.source.identify(
                message.body, message.headers, message.broker_id, self.max_body_bytes
            )
        except Rejected as exc:
            await self._dead_letter(message, exc.detail)
            return
        headers = {
            key: ("[redacted]" if self.source.is_sensitive_header(key) else value)
            for key, value in message.headers.items()
        }
        delay = FIRST_RETRY_SECONDS
        while True:
            try:
                (recorded,) = await self.committer.record(
                    name,
                    [identified],
                    headers,
                    message.body,
                    message.content_type,
                    processed=not self.has_work,
                    searchable=self.searchable,
                )
                break
            except StoreRefused as exc:
                await self._dead_letter(message, f"the database cannot store it: {exc}")
                return
            except (StoreUnavailable, StoreOverloaded) as exc:
                # Nothing is acked while the database is away: the message waits here, and
                # once `prefetch` wait the broker sends no more.
                self.status.last_error = f"{type(exc).__name__}: {exc}"
                self._set_state("waiting for the database")
                if self.stop.is_set():
                    await self._release(message)
                    return
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stop.wait(), timeout=delay)
                delay = min(delay * 2, MAX_RETRY_SECONDS)
        if self.status.state == "waiting for the database":
            self._set_state("connected")
        try:
            await message.ack()
        except Exception as exc:  # the connection went: the broker hands it out again
            log.warning(
                "ack lost with the connection; the broker will redeliver the message",
                extra={"source": name, "message_id": identified.message_id, "error": str(exc)},
            )
            self._counted("ack_lost")
            return
        self._counted(recorded.outcome)

    async def _dead_letter(self, message: BrokerMessage, reason: str) -> None:
        log.warning(
            "message dead-lettered on the broker",
            extra={"source": self.source.name, "reason": reason, "broker_id": message.broker_id},
        )
        try:
            await message.dead_letter(reason)
        except Exception as exc:  # not moved: it stays on the broker, handed out again
            log.warning(
                "could not dead-letter the message; the broker will redeliver it",
                extra={"source": self.source.name, "error": f"{type(exc).__name__}: {exc}"},
            )
            return
        self._counted("dead_lettered")

    async def _release(self, message: BrokerMessage) -> None:
        with contextlib.suppress(Exception):
            await message.release()
        self._counted("released")

    def _counted(self, outcome: str) -> None:
        self.status.count(outcome)
        if self.metrics is not None:
            self.metrics.consumer_message(self.source.name, outcome)
