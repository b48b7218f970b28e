"""Any CloudEvents sender over HTTP: binary, structured and batched modes; dedup on source + id."""

from __future__ import annotations

from pydantic import Field

from service.sources.base import (
    Handshake,
    Messages,
    RawDelivery,
    Source,
)
from service.sources.body_hmac import BodyHmacConfig, body_hmac
from service.sources.cloudevents_http import abuse_protection, read_events


class CloudEventsConfig(BodyHmacConfig):
    # Who may pass the OPTIONS abuse-protection handshake; "*" is anyone who can reach us.
    allowed_origins: list[str] = Field(default_factory=lambda: ["*"], min_length=1)
    allowed_rate: str | None = Field(default=None, pattern=r"^(\*|[1-9][0-9]*)$")


class CloudEventsSource(Source[CloudEventsConfig]):
    kind = "cloudevents"
    # Unknown sender and retry policy: the generic window. Event Grid's CloudEvents schema
    # retries for at most 24 hours; Knative brokers retry for minutes.
    redelivery_days = 3.0

    def __init__(self, name: str, config: CloudEventsConfig) -> None:
        super().__init__(name, config)
        self._body_hmac = body_hmac(config)

    def is_sensitive_header(self, name: str) -> bool:
        return super().is_sensitive_header(name) or self.config.is_hmac_header(name)

    async def verify(self, delivery: RawDelivery) -> Messages:
        if self._body_hmac is not None:
            self._body_hmac.check(delivery)
        return read_events(delivery)

    async def options(self, delivery: RawDelivery) -> Handshake | None:
        return abuse_protection(delivery, self.config.allowed_origins, self.config.allowed_rate)
