"""Any CloudEvents sender over HTTP: binary, structured and batched modes; dedup on source + id."""

from __future__ import annotations

from pydantic import Field

from service.sources.base import (
    Handshake,
    Messages,
    RawDelivery,
)
from service.sources.body_hmac import BodyHmacConfig, BodyHmacSource
from service.sources.cloudevents_http import abuse_protection, read_events


class CloudEventsConfig(BodyHmacConfig):
    # Who may pass the OPTIONS abuse-protection handshake; "*" is anyone who can reach us.
    allowed_origins: list[str] = Field(default_factory=lambda: ["*"], min_length=1)
    allowed_rate: str | None = Field(default=None, pattern=r"^(\*|[1-9][0-9]*)$")


class CloudEventsSource(BodyHmacSource[CloudEventsConfig]):
    kind = "cloudevents"
    # Unknown sender and retry policy: the generic window. Event Grid's CloudEvents schema
    # retries for at most 24 hours; Knative brokers retry for minutes.
    redelivery_days = 3.0

    async def verify(self, delivery: RawDelivery) -> Messages:
        if self._body_hmac is not None:
            self._body_hmac.check(delivery)
        return read_events(delivery)

    async def options(self, delivery: RawDelivery) -> Handshake | None:
        return abuse_protection(delivery, self.config.allowed_origins, self.config.allowed_rate)
