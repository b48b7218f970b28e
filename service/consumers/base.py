"""What a broker client gives the consumer: messages to record, each acked, handed back or
dead-lettered once its fate is known."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass


@dataclass
class BrokerMessage(ABC):
    """One message taken from a broker and not yet settled there."""

    body: bytes
    headers: Mapping[str, str]
    # The broker's own id of the message, where it has one (AMQP `message_id`, the JetStream
    # `Nats-Msg-Id` header, a stream entry's id).
    broker_id: str | None
    content_type: str | None

    @abstractmethod
    async def ack(self) -> None:
        """Its row is committed (or it was a duplicate): the broker forgets it."""

    @abstractmethod
    async def release(self) -> None:
        """Not recorded (stopping, the database away): the broker hands it out again."""

    @abstractmethod
    async def dead_letter(self, reason: str) -> None:
        """It can never be recorded: moved to the broker's dead letters with `reason`, then
        acked, so that it is kept where an operator finds it and never silently dropped."""


class BrokerClient(ABC):
    """A connection to one broker for one source: connect, then messages until it is lost."""

    @abstractmethod
    async def connect(self) -> None:
        """Connect and subscribe; raise when the broker cannot be reached."""

    @abstractmethod
    def messages(self) -> AsyncIterator[BrokerMessage]:
        """The messages as they come, at most `prefetch` unsettled at once; ends or raises when
        the connection is lost."""

    @abstractmethod
    async def close(self) -> None:
        """Close the connection; messages not settled go back to the broker."""

    async def lag(self) -> int | None:
        """Messages waiting on the broker for this consumer, where the broker says."""
        return None
