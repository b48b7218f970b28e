"""Dapr pub/sub HTTP subscriptions: a CloudEvents envelope, answered with Dapr's `status` body."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from functools import cached_property
from typing import Any, Literal

from service.sources.base import (
    BadDelivery,
    Handshake,
    HeaderName,
    Messages,
    RawDelivery,
    Recorded,
    Rejected,
    Source,
    Unauthenticated,
    UnsupportedMediaType,
    constant_time_equal,
)
from service.sources.cloudevents_http import STRUCTURED, structured_event
from service.sources.config import Secret, SourceConfig, secret_text

log = logging.getLogger("service.sources.dapr")

API_TOKEN_HEADER = HeaderName("dapr-api-token")


class DaprConfig(SourceConfig):
    # The sidecar's APP_API_TOKEN, sent in `dapr-api-token` on every call to the app.
    app_api_token: Secret | None = None
    # A delivery that can never be recorded (malformed, no id): "drop" answers DROP so the
    # sidecar stops at once; "reject" answers the 400/415 problem, so Dapr retries it under its
    # resiliency policy and then hands it to the subscription's dead-letter topic, if any.
    on_malformed: Literal["drop", "reject"] = "drop"


class DaprSource(Source[DaprConfig]):
    kind = "dapr"
    sensitive_headers = frozenset({API_TOKEN_HEADER.name})
    # Dapr redelivers for as long as its broker keeps the message unacknowledged; 7 days
    # covers Kafka's default retention and Pub/Sub's and Service Bus's usual settings.
    redelivery_days = 7.0

    @cached_property
    def _app_api_token(self) -> str | None:
        return secret_text(self.config.app_api_token)

    async def verify(self, delivery: RawDelivery) -> Messages:
        if self._app_api_token is not None:
            offered = API_TOKEN_HEADER.required(delivery.raw_headers)
            if not constant_time_equal(offered, self._app_api_token):
                raise Unauthenticated(f"{API_TOKEN_HEADER.name} does not match app_api_token")
        # Dapr posts the envelope in structured mode; a publisher's own CloudEvent may arrive as
        # plain JSON. A raw payload (metadata.rawPayload) carries no id to deduplicate on.
        if delivery.media_type not in (STRUCTURED, "application/json"):
            raise UnsupportedMediaType(
                f"content type {delivery.media_type!r}: Dapr delivers {STRUCTURED}"
            )
        return structured_event(delivery)

    def respond(self, results: Sequence[Recorded], batch: bool) -> tuple[int, Any]:
        # A duplicate is SUCCESS too: anything else would make the sidecar redeliver a
        # message that is already recorded.
        (only,) = results
        return 200, {"status": "SUCCESS", "message_id": only.message_id, "outcome": only.outcome}

    def answer_rejection(self, rejected: Rejected) -> Handshake | None:
        # 401 stays a problem (Dapr retries: a rotated token heals); 503 from the store is
        # already a non-2xx, which Dapr retries like RETRY.
        if self.config.on_malformed == "drop" and isinstance(
            rejected, BadDelivery | UnsupportedMediaType
        ):
            log.warning(
                "dapr delivery dropped",
                extra={"source": self.name, "reason": rejected.reason, "detail": rejected.detail},
            )
            return Handshake(200, {"status": "DROP", "detail": rejected.detail})
        return None
