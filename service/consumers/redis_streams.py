"""Redis Streams (redis-py asyncio): a stream read through a consumer group, each entry XACKed
after its row commits; entries a dead consumer left pending are taken over with XAUTOCLAIM, and
one that cannot be recorded is added to the dead-letter stream and acked in one script."""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field

import redis.asyncio
from redis.exceptions import ResponseError

from service.consumers.base import BrokerClient, BrokerMessage
from service.sources.brokers import BrokerSource, RedisStreamsConfig, RedisStreamsSource

log = logging.getLogger("service.consumers")

BODY_FIELD = b"body"
CONTENT_TYPE_FIELD = b"content-type"
REASON_FIELD = b"inbox-dead-letter-reason"
# How long one XREADGROUP waits for new entries before the loop looks at releases and claims.
BLOCK_MS = 1000
# A silent network loss raises after this long instead of hanging; more than BLOCK_MS.
SOCKET_TIMEOUT_SECONDS = 10.0
# The XAUTOCLAIM sweep runs every claim_idle_seconds / 2, and at least this often.
MOST_SECONDS_BETWEEN_CLAIMS = 5.0
# Connections at most: one for the blocking read, the rest for the acks of a committed batch.
MAX_CONNECTIONS = 8

# XADD then XACK in a script rather than MULTI/EXEC: a transaction still runs its XACK when its
# XADD fails (a dead-letter key holding another type answers WRONGTYPE), and the entry is lost;
# a script stops at the error, before the XACK. Either way no other command runs in between.
DEAD_LETTER_SCRIPT = """
redis.call('XADD', KEYS[2], '*', unpack(ARGV, 3))
return redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
"""

Entry = tuple[bytes, dict[bytes, bytes] | None]


def consumer_name() -> str:
    """This process's name in the group: a restarted process is a new consumer, and what its
    predecessor held is taken over by XAUTOCLAIM once idle for `claim_idle_seconds`."""
    return f"{socket.gethostname()}-{os.getpid()}"


def _text(value: bytes) -> str:
    return value.decode("utf-8", "replace")


@dataclass
class RedisStreamsMessage(BrokerMessage):
    client: RedisStreamsClient | None = None
    entry_id: str = ""
    fields: Mapping[bytes, bytes] = field(default_factory=dict)

    async def ack(self) -> None:
        assert self.client is not None
        await self.client.ack(self.entry_id)

    async def release(self) -> None:
        assert self.client is not None
        self.client.release(self.entry_id)

    async def dead_letter(self, reason: str) -> None:
        assert self.client is not None
        await self.client.dead_letter(self.entry_id, self.fields, reason)


class RedisStreamsClient(BrokerClient):
    def __init__(self, source: BrokerSource, consumer: str | None = None) -> None:
        assert isinstance(source, RedisStreamsSource)
        self.source = source
        self.config: RedisStreamsConfig = source.config
        self.consumer = consumer or consumer_name()
        self.redis: redis.asyncio.Redis | None = None
        # Entries fetched and not yet settled: never more than `prefetch`, and never handed
        # out twice when a re-read of the pending entries or a claim finds them again.
        self._taken: set[str] = set()
        # This consumer's own pending entries are read (from id "0") before new ones: at start,
        # and again after a release.
        self._reread_from: str | None = "0"
        self._claim_from = "0-0"
        self._next_claim = 0.0

    def _connected(self) -> redis.asyncio.Redis:
        if self.redis is None:
            raise ConnectionError("not connected")
        return self.redis

    async def connect(self) -> None:
        # RESP2 for the same reply shapes under every redis-py version the extra allows.
        pool = redis.asyncio.BlockingConnectionPool.from_url(
            self.source.url,
            max_connections=MAX_CONNECTIONS,
            protocol=2,
            socket_connect_timeout=10,
            socket_timeout=SOCKET_TIMEOUT_SECONDS,
        )
        client = self.redis = redis.asyncio.Redis.from_pool(pool)
        try:
            # From id 0, not `$`: entries added before the group existed are consumed too.
            await client.xgroup_create(self.config.stream, self.config.group, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    async def messages(self) -> AsyncIterator[BrokerMessage]:
        while True:
            for entry_id, fields in await self._fetch():
                message = await self._message(entry_id, fields)
                if message is not None:
                    yield message

    async def _fetch(self) -> list[Entry]:
        """The next entries to hand out, at most `prefetch` less those unsettled: this
        consumer's own pending ones first, then those idle elsewhere, then new ones."""
        client = self._connected()
        stream, group = self.config.stream, self.config.group
        room = max(self.config.prefetch - len(self._taken), 1)
        if self._reread_from is not None:
            replies = await client.xreadgroup(
                group, self.consumer, {stream: self._reread_from}, count=room
            )
            entries = _entries(replies)
            # Read page by page; an empty page is the end of this consumer's pending entries.
            self._reread_from = _text(entries[-1][0]) if entries else None
            return self._fresh(entries)
        now = time.monotonic()
        if now >= self._next_claim:
            cursor, claimed = await self._claim(room)
            self._claim_from = cursor
            if cursor == "0-0":  # the sweep went through the whole pending list
                interval = self.config.claim_idle_seconds / 2
                self._next_claim = now + min(interval, MOST_SECONDS_BETWEEN_CLAIMS)
            fresh = self._fresh(claimed)
            if fresh:
                return fresh
        replies = await client.xreadgroup(
            group, self.consumer, {stream: ">"}, count=room, block=BLOCK_MS
        )
        return self._fresh(_entries(replies))

    async def _claim(self, count: int) -> tuple[str, list[Entry]]:
        """XAUTOCLAIM: entries any consumer of the group (a dead one, or this one when its
        fetch was lost with the connection) has held longer than `claim_idle_seconds`."""
        reply = await self._connected().xautoclaim(
            self.config.stream,
            self.config.group,
            self.consumer,
            int(self.config.claim_idle_seconds * 1000),
            self._claim_from,
            count=count,
        )
        # [next cursor, entries, ids deleted from the stream] (the third since Redis 7, which
        # drops those from the pending list itself).
        return _text(reply[0]), list(reply[1])

    def _fresh(self, entries: list[Entry]) -> list[Entry]:
        """The entries not already handed out, now counted as taken."""
        fresh = [(i, f) for i, f in entries if _text(i) not in self._taken]
        self._taken.update(_text(i) for i, _ in fresh)
        return fresh

    async def _message(
        self, raw_id: bytes, fields: dict[bytes, bytes] | None
    ) -> RedisStreamsMessage | None:
        entry_id = _text(raw_id)
        if not fields:
            # Pending, but deleted from the stream (trimmed) since: nothing to record.
            log.warning(
                "pending entry no longer in the stream; acked",
                extra={"source": self.source.name, "broker_id": entry_id},
            )
            await self.ack(entry_id)
            return None
        body = fields.get(BODY_FIELD)
        if body is None:
            names = ", ".join(sorted(_text(name) for name in fields))
            reason = f"the entry has no body field (its fields: {names})"
            log.warning(
                "message dead-lettered on the broker",
                extra={"source": self.source.name, "reason": reason, "broker_id": entry_id},
            )
            try:
                await self.dead_letter(entry_id, fields, reason)
            except ResponseError as exc:  # left pending: claimed again once idle
                log.warning(
                    "could not dead-letter the message; it will be claimed again",
                    extra={"source": self.source.name, "error": str(exc)},
                )
            return None
        content_type = fields.get(CONTENT_TYPE_FIELD)
        headers = {
            _text(name): _text(value)
            for name, value in fields.items()
            if name not in (BODY_FIELD, CONTENT_TYPE_FIELD)
        }
        return RedisStreamsMessage(
            body,
            headers,
            entry_id,
            None if content_type is None else _text(content_type),
            client=self,
            entry_id=entry_id,
            fields=fields,
        )

    async def ack(self, entry_id: str) -> None:
        """XACK only: the entry stays in the stream, whose trimming is its owner's
        (`XADD ... MAXLEN`, `XTRIM`)."""
        try:
            await self._connected().xack(self.config.stream, self.config.group, entry_id)
        finally:
            self._taken.discard(entry_id)

    def release(self, entry_id: str) -> None:
        """Nothing to tell Redis: the entry stays pending for this consumer, read again from
        its pending entries before any new one."""
        self._taken.discard(entry_id)
        self._reread_from = "0"

    async def dead_letter(self, entry_id: str, fields: Mapping[bytes, bytes], reason: str) -> None:
        """XADD to the dead-letter stream (the entry's fields and the reason), then XACK, in
        one script: both happen or neither."""
        moved = {**fields, REASON_FIELD: reason.encode()}
        arguments: list[bytes | str] = [self.config.group, entry_id]
        for name, value in moved.items():
            arguments += [name, value]
        try:
            await self._connected().register_script(DEAD_LETTER_SCRIPT)(
                keys=[self.config.stream, self.source.dead_letter_stream], args=arguments
            )
        finally:
            self._taken.discard(entry_id)

    async def close(self) -> None:
        if self.redis is not None:
            await self.redis.aclose()

    async def lag(self) -> int | None:
        """Entries not yet delivered to the group (XINFO GROUPS `lag`, Redis 7); where Redis
        cannot say (Redis 6, or after deletions), the entries delivered and not yet acked."""
        if self.redis is None:
            return None
        for group in await self.redis.xinfo_groups(self.config.stream):
            if _text(group["name"]) == self.config.group:
                lag = group.get("lag")
                return int(group["pending"] if lag is None else lag)
        return None


def _entries(replies: object) -> list[Entry]:
    """The entries of an XREADGROUP reply for one stream (RESP2: `[[stream, [(id, fields),
    ...]]]`, empty when none came)."""
    if not replies:
        return []
    assert isinstance(replies, list)
    entries = replies[0][1]
    assert isinstance(entries, list)
    return entries
