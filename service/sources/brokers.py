"""Broker sources: `rabbitmq`, `nats` (a JetStream durable consumer) and `redis-streams` (a
consumer group). Their messages are taken by `webhook-inbox consume` (service/consumers/), not
posted to `/webhooks/NAME`: a broker's own delivery is the authentication, so there is no
signature to verify. What each kind configures is where to read from, and where a message's
id is (docs/brokers.md)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import cached_property
from typing import Annotated, Any, ClassVar

from pydantic import AfterValidator, Field, model_validator

from service.sources.base import BadDelivery, Message, RawDelivery, Rejected, Source, Verdict
from service.sources.config import HEADER_PREFIX, Secret, SourceConfig, check_ordering_key
from service.sources.jsonpointer import resolve_pointer
from service.sources.limits import checked_event_type, checked_message_id

BROKER_ID = "broker"
_NAME = r"^[A-Za-z0-9_.:-]{1,255}$"


def check_id_rule(value: str) -> str:
    """`broker`, `header:Name` or a JSON pointer (`/id`)."""
    if value == BROKER_ID:
        return value
    return check_ordering_key(value)


IdRule = Annotated[str, AfterValidator(check_id_rule)]
Name = Annotated[str, Field(pattern=_NAME)]


class BrokerConfig(SourceConfig):
    """Keys every broker kind takes besides a source's own."""

    # The broker's URL, or `env:NAME`: it holds the credentials.
    url: Secret
    # Messages taken from the broker and not yet acknowledged, at most.
    prefetch: int = Field(default=100, ge=1, le=10_000)
    # Where a message's id is: the broker's own (`broker`), a header (`header:Name`) or a JSON
    # pointer into the body. A message without one is dead-lettered on the broker's side.
    message_id: IdRule = BROKER_ID
    event_type: Annotated[str, AfterValidator(check_ordering_key)] | None = None

    @model_validator(mode="after")
    def _async_only(self) -> BrokerConfig:
        if self.mode == "sync":
            raise ValueError(
                "a broker source's messages are acked after their row commits; its handlers "
                'run in the worker (mode = "async")'
            )
        return self


class NotAnHttpSource(Rejected):
    status = 404
    reason = "broker_source"


class BrokerSource(Source[Any]):
    """A source fed by a broker: `identify` names each message; HTTP deliveries are refused."""

    broker: ClassVar[str]
    # How long a broker may hand a message again: until it is acked, which happens after its
    # row commits, so a redelivery comes soon; a producer's own retry (an outbox's relay) may
    # come later.
    redelivery_days = 3.0

    async def verify(self, delivery: RawDelivery) -> Verdict:
        raise NotAnHttpSource(
            f"source {self.name!r} consumes from {self.broker}; it takes no HTTP deliveries"
        )

    @cached_property
    def url(self) -> str:
        return str(self.config.url.get_secret_value())

    def identify(
        self, body: bytes, headers: Mapping[str, str], broker_id: str | None, max_bytes: int
    ) -> Message:
        """The message to record for a broker message, or `BadDelivery` saying why it cannot be
        (too large, no id where the source says it is): the consumer dead-letters it."""
        if len(body) > max_bytes:
            raise BadDelivery(f"the body is {len(body)} bytes, over the {max_bytes}-byte limit")
        rule = self.config.message_id
        document: Any = None
        if rule.startswith("/") or (self.config.event_type or "").startswith("/"):
            try:
                document = json.loads(body)
            except ValueError:  # not JSON: no field is found in it
                document = None
        if rule == BROKER_ID:
            found: Any = broker_id
            where = f"the {self.broker} message id"
        else:
            found, where = _value(rule, headers, document)
        message_id = checked_message_id(found, where)
        event_type = None
        if self.config.event_type is not None:
            value, where = _value(self.config.event_type, headers, document)
            event_type = checked_event_type(value, where)
        return Message(message_id, event_type)


def _value(rule: str, headers: Mapping[str, str], document: Any) -> tuple[Any, str]:
    if rule.startswith(HEADER_PREFIX):
        name = rule[len(HEADER_PREFIX) :]
        lowered = {k.lower(): v for k, v in headers.items()}
        return lowered.get(name), f"the {name} header"
    return resolve_pointer(document, rule), f"the JSON field {rule}"


class RabbitMQConfig(BrokerConfig):
    """`kind = "rabbitmq"`: a durable queue, consumed with manual acks."""

    queue: Name
    # Where a message that cannot be recorded goes (declared durable): by default QUEUE.dead.
    dead_letter_queue: Name | None = None


class RabbitMQSource(BrokerSource):
    kind = "rabbitmq"
    broker = "RabbitMQ"
    config_model = RabbitMQConfig

    @property
    def dead_letter_queue(self) -> str:
        return self.config.dead_letter_queue or f"{self.config.queue}.dead"


def subject_matches(pattern: str, subject: str) -> bool:
    """Whether a NATS subject filter (`*` one token, `>` the rest) matches a literal subject."""
    tokens, wanted = pattern.split("."), subject.split(".")
    for at, token in enumerate(tokens):
        if token == ">":
            return len(wanted) > at
        if at >= len(wanted) or token not in ("*", wanted[at]):
            return False
    return len(tokens) == len(wanted)


def _has_wildcard(subject: str) -> bool:
    return any(token in ("*", ">") for token in subject.split("."))


# JetStream refuses a `.` in a stream's or a consumer's name (it is a subject separator).
JetStreamName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_:-]{1,250}$")]


class NatsConfig(BrokerConfig):
    """`kind = "nats"`: a JetStream stream read by a durable pull consumer."""

    stream: JetStreamName
    subject: Annotated[str, Field(pattern=r"^[^\s]{1,255}$")]
    durable: JetStreamName = "webhook-inbox"
    # A subject some stream keeps, where a message that cannot be recorded is published.
    dead_letter_subject: Annotated[str, Field(pattern=r"^[^\s]{1,255}$")] | None = None
    # Seconds a message taken and not acked waits before JetStream hands it out again.
    ack_wait_seconds: float = Field(default=30.0, gt=0, le=3600)

    @model_validator(mode="after")
    def _dead_letters_leave_the_subject(self) -> NatsConfig:
        # A dead letter is published to one subject, so it cannot be a wildcard; and one the
        # consumer reads would come back to it, be dead-lettered again, and so on forever.
        dead = self.dead_letter_subject
        if dead is None:
            if _has_wildcard(self.subject):
                raise ValueError(
                    f"subject {self.subject!r} has a wildcard: set dead_letter_subject to a "
                    "subject without one that it does not match"
                )
            return self
        if _has_wildcard(dead):
            raise ValueError(f"dead_letter_subject {dead!r} must not have a wildcard")
        if subject_matches(self.subject, dead):
            raise ValueError(
                f"dead_letter_subject {dead!r} is matched by subject {self.subject!r}: the "
                "consumer would read its own dead letters; choose a subject outside it"
            )
        return self


class NatsSource(BrokerSource):
    kind = "nats"
    broker = "NATS JetStream"
    config_model = NatsConfig

    @property
    def dead_letter_subject(self) -> str:
        return self.config.dead_letter_subject or f"{self.config.subject}.dead"


class RedisStreamsConfig(BrokerConfig):
    """`kind = "redis-streams"`: a stream read through a consumer group."""

    stream: Name
    group: Name = "webhook-inbox"
    # A stream where a message that cannot be recorded is added, with why.
    dead_letter_stream: Name | None = None
    # A message another consumer took and has not acked for this long is taken over
    # (XAUTOCLAIM): Redis hands nothing out again by itself.
    claim_idle_seconds: float = Field(default=60.0, gt=0, le=86_400)


class RedisStreamsSource(BrokerSource):
    kind = "redis-streams"
    broker = "Redis Streams"
    config_model = RedisStreamsConfig

    @property
    def dead_letter_stream(self) -> str:
        return self.config.dead_letter_stream or f"{self.config.stream}:dead"


BROKER_KINDS: tuple[type[BrokerSource], ...] = (RabbitMQSource, NatsSource, RedisStreamsSource)
# The optional extra each kind's client comes from (`pip install webhook-inbox[rabbitmq]`).
EXTRAS = {
    "rabbitmq": ("aio_pika", "rabbitmq"),
    "nats": ("nats", "nats"),
    "redis-streams": ("redis", "redis"),
}
