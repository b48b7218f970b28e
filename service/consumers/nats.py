"""NATS JetStream (nats-py): a durable pull consumer with explicit acks, at most `prefetch`
unacked; an ack waits for the server's confirmation, and a message that cannot be recorded is
published to the dead-letter subject (the PubAck awaited) and only then acked."""

from __future__ import annotations

import contextlib
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig

from service.consumers.base import BrokerClient, BrokerMessage
from service.sources.brokers import BrokerSource, NatsSource

log = logging.getLogger("service.consumers")

REASON_HEADER = "Inbox-Dead-Letter-Reason"
MSG_ID_HEADER = "Nats-Msg-Id"
# How long one pull request waits for messages; an empty one is simply sent again. It also
# bounds how long a fetched message can wait for the rest of its batch.
FETCH_SECONDS = 2.0
# A ping every 5 s, the connection given up after 3 unanswered: a broker that vanished without
# closing the socket is noticed in about 20 s, not nats-py's default 4 minutes.
PING_SECONDS = 5
SERVER_REPLY_SECONDS = 5.0


def _header(headers: dict[str, str], name: str) -> str | None:
    lowered = name.lower()
    return next((v for k, v in headers.items() if k.lower() == lowered), None)


def _moved_headers(headers: dict[str, str], reason: str) -> dict[str, str]:
    """The original's headers on its dead letter, but the `Nats-` ones that instruct the stream
    taking a publish (an expected last sequence, a rollup, a TTL): meant for the original's
    stream, they would make the dead letter's publish fail or purge the dead letters.
    `Nats-Msg-Id` stays, so a dead letter published twice is kept once."""
    kept = {k: v for k, v in headers.items() if not k.startswith("Nats-") or k == MSG_ID_HEADER}
    return {**kept, REASON_HEADER: reason}


@dataclass
class NatsMessage(BrokerMessage):
    msg: Msg | None = None
    js: JetStreamContext | None = None
    dead_letter_subject: str = ""
    settled: Callable[[], None] = lambda: None

    async def ack(self) -> None:
        assert self.msg is not None
        try:
            # A plain ack is fire-and-forget; waiting for the server's reply means an ack
            # lost with the connection is known lost (the runner logs it) instead of assumed.
            await self.msg.ack_sync(timeout=SERVER_REPLY_SECONDS)
        finally:
            self.settled()

    async def release(self) -> None:
        assert self.msg is not None
        try:
            await self.msg.nak()
        finally:
            self.settled()

    async def dead_letter(self, reason: str) -> None:
        assert self.msg is not None
        assert self.js is not None
        try:
            # Returns once a stream holds the copy (its PubAck); with no stream capturing the
            # subject it raises, and the original stays on the broker, not acked.
            await self.js.publish(
                self.dead_letter_subject,
                self.msg.data,
                timeout=SERVER_REPLY_SECONDS,
                headers=_moved_headers(dict(self.msg.headers or {}), reason),
            )
            await self.msg.ack_sync(timeout=SERVER_REPLY_SECONDS)
        finally:
            self.settled()


class NatsClient(BrokerClient):
    def __init__(self, source: BrokerSource) -> None:
        assert isinstance(source, NatsSource)
        self.source = source
        self.connection: Client | None = None
        self.js: JetStreamContext | None = None
        self.subscription: JetStreamContext.PullSubscription | None = None
        # Fetched and not yet settled (handed to the runner or waiting here): a pull asks for
        # no more than `prefetch` less these, as JetStream would deliver no more anyway.
        self._unsettled = 0
        self._fetched: deque[Msg] = deque()

    async def connect(self) -> None:
        config = self.source.config
        # nats-py's own reconnecting is off: a lost connection closes the client, the fetch
        # raises, and the runner reconnects with its backoff and reports it meanwhile.
        self.connection = await nats.connect(
            self.source.url,
            allow_reconnect=False,
            connect_timeout=10,
            ping_interval=PING_SECONDS,
            max_outstanding_pings=3,
            error_cb=self._error,
        )
        js = self.js = self.connection.jetstream(timeout=SERVER_REPLY_SECONDS)
        try:
            await js.stream_info(config.stream)
        except nats.js.errors.NotFoundError:
            # Only when absent: an existing stream's subjects, limits and retention are the
            # operator's, never changed here.
            await js.add_stream(name=config.stream, subjects=[config.subject])
        dead = self.source.dead_letter_subject
        try:
            await js.find_stream_name_by_subject(dead)
        except nats.js.errors.NotFoundError:
            await js.add_stream(name=f"{config.stream}_DEAD", subjects=[dead])
        # Created, or updated to this config (its position in the stream kept), so a changed
        # prefetch or ack_wait takes effect at the next connect.
        await js.add_consumer(
            config.stream,
            ConsumerConfig(
                name=config.durable,
                durable_name=config.durable,
                filter_subject=config.subject,
                ack_policy=AckPolicy.EXPLICIT,
                ack_wait=config.ack_wait_seconds,
                max_ack_pending=config.prefetch,
            ),
        )
        self.subscription = await js.pull_subscribe_bind(
            durable=config.durable, stream=config.stream
        )

    async def _error(self, exc: Exception) -> None:
        log.warning(
            "nats client error",
            extra={"source": self.source.name, "error": f"{type(exc).__name__}: {exc}"},
        )

    async def messages(self) -> AsyncIterator[BrokerMessage]:
        assert self.subscription is not None
        assert self.connection is not None
        prefetch = self.source.config.prefetch
        timeout = min(FETCH_SECONDS, self.source.config.ack_wait_seconds / 2)
        # While the stream has nothing for us (at first, and once a pull came back short) ask
        # for one message, which returns as soon as it comes: a pull for a batch that finds
        # too few holds the first ones until its timeout, waiting for the rest.
        drained = True
        while True:
            if not self._fetched:
                batch = 1 if drained else max(1, prefetch - self._unsettled)
                try:
                    fetched = await self.subscription.fetch(batch, timeout=timeout)
                except nats.errors.TimeoutError:
                    if self.connection.is_closed:
                        raise ConnectionError("the connection to NATS was lost") from None
                    drained = True
                    continue
                drained = len(fetched) < batch
                self._unsettled += len(fetched)
                self._fetched.extend(fetched)
            yield self._message(self._fetched.popleft())

    def _message(self, msg: Msg) -> NatsMessage:
        headers = dict(msg.headers or {})
        # The stream sequence names one stored message: a producer publishing the same message
        # again makes a new sequence, while its `Nats-Msg-Id` stays the same.
        broker_id = _header(headers, MSG_ID_HEADER)
        if broker_id is None:
            broker_id = f"{msg.metadata.stream}:{msg.metadata.sequence.stream}"
        return NatsMessage(
            msg.data,
            headers,
            broker_id,
            _header(headers, "Content-Type"),
            msg=msg,
            js=self.js,
            dead_letter_subject=self.source.dead_letter_subject,
            settled=self._settled,
        )

    def _settled(self) -> None:
        self._unsettled -= 1

    async def close(self) -> None:
        # Fetched but never handed to the runner: handed back now rather than after ack_wait.
        while self._fetched:
            msg = self._fetched.popleft()
            with contextlib.suppress(Exception):  # a lost connection: back after ack_wait
                await msg.nak()
        if self.connection is not None and not self.connection.is_closed:
            await self.connection.close()

    async def lag(self) -> int | None:
        if self.subscription is None:
            return None
        info = await self.subscription.consumer_info()
        return None if info.num_pending is None else int(info.num_pending)
