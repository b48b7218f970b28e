"""Azure Event Grid webhooks: event arrays deduped per event, and the subscription validation."""

from __future__ import annotations

import logging
from functools import cached_property
from typing import Any

from pydantic import Field, field_validator, model_validator

from service.sources.base import (
    BadDelivery,
    Handshake,
    HeaderName,
    Message,
    Messages,
    RawDelivery,
    Source,
    Unauthenticated,
    constant_time_equal,
    parse_json,
    require_json_media_type,
)
from service.sources.cloudevents_http import abuse_protection, read_events, serialized
from service.sources.config import SourceConfig
from service.sources.limits import checked_event_type, checked_header_name, checked_message_id

log = logging.getLogger("service.sources.eventgrid")

VALIDATION_EVENT = "Microsoft.EventGrid.SubscriptionValidationEvent"


class EventGridConfig(SourceConfig):
    # Event Grid signs nothing. Besides the common `token` (put `?token=...` in the endpoint
    # URL), a subscription can send a static header (a "delivery property", marked secret) whose
    # value must be one of `secrets`; `key_header` names it.
    key_header: str | None = Field(default=None, min_length=1)
    # The CloudEvents-schema subscriptions validate with OPTIONS (CloudEvents webhook spec).
    allowed_origins: list[str] = Field(default_factory=lambda: ["eventgrid.azure.net"])

    @field_validator("key_header")
    @classmethod
    def _header_name(cls, value: str | None) -> str | None:
        return None if value is None else checked_header_name(value)

    @model_validator(mode="after")
    def _coherent(self) -> EventGridConfig:
        if self.key_header and not self.secrets:
            raise ValueError("key_header needs at least one entry in secrets")
        if self.secrets and not self.key_header:
            raise ValueError("secrets are compared with a header; set key_header")
        return self


class EventGridSource(Source[EventGridConfig]):
    kind = "eventgrid"
    # Event Grid retries for the event's time-to-live: 1440 minutes by default and at most.
    redelivery_days = 1.0

    def __init__(self, name: str, config: EventGridConfig) -> None:
        super().__init__(name, config)
        self._key_header = HeaderName(config.key_header) if config.key_header else None

    @cached_property
    def _keys(self) -> list[bytes]:
        return self.config.secret_values()

    def is_sensitive_header(self, name: str) -> bool:
        key_header = (self.config.key_header or "").lower()
        return super().is_sensitive_header(name) or name.lower() == key_header

    async def verify(self, delivery: RawDelivery) -> Messages | Handshake:
        if self._key_header is not None:
            self._check_key(delivery, self._key_header)
        if delivery.media_type.startswith("application/cloudevents"):
            return read_events(delivery, binary=False)
        require_json_media_type(delivery)
        events = parse_json(delivery.body)
        if not isinstance(events, list):
            raise BadDelivery("an Event Grid delivery is a JSON array of events")
        if (
            events
            and isinstance(events[0], dict)
            and events[0].get("eventType") == VALIDATION_EVENT
        ):
            return self._validation(events[0])
        messages = []
        for index, event in enumerate(events):
            where = f"the field [{index}].id"
            if not isinstance(event, dict):
                raise BadDelivery(f"event [{index}] is not a JSON object")
            message_id = checked_message_id(event.get("id"), where)
            event_type = checked_event_type(
                event.get("eventType"), f"the field [{index}].eventType"
            )
            messages.append(
                Message(
                    message_id,
                    event_type,
                    body=serialized(event),
                    content_type="application/json",
                )
            )
        return Messages(messages, batch=True)

    def _validation(self, event: dict[str, Any]) -> Handshake:
        data = event.get("data")
        code = data.get("validationCode") if isinstance(data, dict) else None
        if not isinstance(code, str) or not code:
            raise BadDelivery("missing data.validationCode in the SubscriptionValidationEvent")
        log.info("eventgrid subscription validated", extra={"source": self.name})
        return Handshake(200, {"validationResponse": code})

    def _check_key(self, delivery: RawDelivery, header: HeaderName) -> None:
        offered = header.required(delivery.raw_headers)
        matches = [constant_time_equal(offered, key) for key in self._keys]
        if not any(matches):
            raise Unauthenticated(f"{header} does not match a configured secret")

    async def options(self, delivery: RawDelivery) -> Handshake | None:
        return abuse_protection(delivery, self.config.allowed_origins, None)
