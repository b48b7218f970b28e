"""Any CloudEvents sender over HTTP: binary, structured and batched modes; dedup on source + id."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, model_validator

from service.core.config import SourceConfig
from service.sources.base import (
    Handshake,
    Messages,
    RawDelivery,
    Source,
    Unauthenticated,
    constant_time_equal,
)
from service.sources.cloudevent import abuse_protection, read_events
from service.sources.generic import GenericSource, HmacConfig


class CloudEventsConfig(SourceConfig):
    hmac: HmacConfig | None = None
    # Who may pass the OPTIONS abuse-protection handshake; "*" is anyone who can reach us.
    allowed_origins: list[str] = Field(default_factory=lambda: ["*"], min_length=1)
    allowed_rate: str | None = Field(default=None, pattern=r"^(\*|[1-9][0-9]*)$")

    @model_validator(mode="after")
    def _coherent(self) -> CloudEventsConfig:
        if self.hmac is not None and not self.secrets:
            raise ValueError("hmac needs at least one entry in secrets")
        if self.secrets and self.hmac is None:
            raise ValueError("secrets are only used with [hmac]; add an hmac table")
        return self


class CloudEventsSource(Source):
    kind = "cloudevents"
    config_model: ClassVar[type[SourceConfig]] = CloudEventsConfig
    # Unknown sender and retry policy: the generic window. Event Grid's CloudEvents schema
    # retries for at most 24 hours; Knative brokers retry for minutes.
    redelivery_days = 3.0

    def __init__(self, name: str, config: SourceConfig) -> None:
        assert isinstance(config, CloudEventsConfig)
        super().__init__(name, config)
        self.ce = config

    def is_sensitive_header(self, name: str) -> bool:
        hmac_header = self.ce.hmac.header.lower() if self.ce.hmac else ""
        return super().is_sensitive_header(name) or name.lower() == hmac_header

    async def verify(self, delivery: RawDelivery) -> Messages:
        if self.ce.hmac is not None:
            check_hmac(delivery, self.ce.hmac, self.config.secret_values())
        return read_events(delivery)

    async def options(self, delivery: RawDelivery) -> Handshake | None:
        return abuse_protection(delivery, self.ce.allowed_origins, self.ce.allowed_rate)


def check_hmac(delivery: RawDelivery, spec: HmacConfig, keys: list[bytes]) -> None:
    """The generic kind's HMAC over the raw body (header, algorithm, encoding, prefix)."""
    header = delivery.headers.get(spec.header)
    if not header:
        raise Unauthenticated(f"missing {spec.header} header")
    if not header.startswith(spec.prefix):
        raise Unauthenticated(f"{spec.header} does not start with {spec.prefix!r}")
    offered = header[len(spec.prefix) :].strip()
    if spec.encoding == "hex":
        offered = offered.lower()
    matches = [
        constant_time_equal(GenericSource.signature(key, delivery.body, spec), offered)
        for key in keys
    ]
    if not any(matches):
        raise Unauthenticated(f"{spec.header} does not match a configured secret")
