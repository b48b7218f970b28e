"""A configurable HMAC of the raw body (`[sources.X.hmac]`) for kinds without a scheme."""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Callable, Sequence
from functools import cached_property
from typing import Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from service.sources.base import HeaderName, RawDelivery, Source, Unauthenticated
from service.sources.config import SourceConfig
from service.sources.limits import checked_header_name
from service.sources.signing import keyed_macs, require_match

_DIGESTS = {"sha1": hashlib.sha1, "sha256": hashlib.sha256, "sha512": hashlib.sha512}


class HmacConfig(BaseModel):
    """`[sources.X.hmac]`: the header carrying an HMAC of the raw body, and how it is written."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    header: str = Field(min_length=1)
    algorithm: Literal["sha1", "sha256", "sha512"] = "sha256"
    encoding: Literal["hex", "base64"] = "hex"
    prefix: str = ""

    @field_validator("header")
    @classmethod
    def _header_name(cls, value: str) -> str:
        return checked_header_name(value)  # never empty: min_length=1 refuses that first


class BodyHmacConfig(SourceConfig):
    """A kind's config with an optional `[hmac]` table, keyed by `secrets`."""

    hmac: HmacConfig | None = None

    @model_validator(mode="after")
    def _secrets_go_with_hmac(self) -> BodyHmacConfig:
        if self.hmac is not None and not self.secrets:
            raise ValueError("hmac needs at least one entry in secrets")
        if self.secrets and self.hmac is None:
            raise ValueError("secrets are only used with [hmac]; add an hmac table")
        return self

    def is_hmac_header(self, name: str) -> bool:
        return self.hmac is not None and name.lower() == self.hmac.header.lower()


def body_signature(key: bytes, body: bytes, spec: HmacConfig) -> str:
    """The signature text (without prefix) a sender computes over `body`."""
    return _encoded(hmac.new(key, body, _DIGESTS[spec.algorithm]).digest(), spec)


def _base64(digest: bytes) -> str:
    return base64.b64encode(digest).decode()


# How a signature is written, by `[hmac]`'s encoding.
_ENCODERS: dict[str, Callable[[bytes], str]] = {"hex": bytes.hex, "base64": _base64}


def _encoded(digest: bytes, spec: HmacConfig) -> str:
    return _ENCODERS[spec.encoding](digest)


class BodyHmac:
    """`[hmac]` as every delivery is checked against it: each secret keyed once, and what the
    check reads of the config read once (a pydantic model's attributes are slow look-ups: see
    `Source`)."""

    def __init__(self, spec: HmacConfig, secrets: Sequence[bytes]) -> None:
        self.macs = keyed_macs(secrets, _DIGESTS[spec.algorithm])
        self._header = HeaderName(spec.header)
        self._prefix = spec.prefix
        self._hex = spec.encoding == "hex"
        self._encode = _ENCODERS[spec.encoding]
        self._mismatch = f"{spec.header} does not match a configured secret"

    def check(self, delivery: RawDelivery) -> None:
        """401 unless the header carries the HMAC of the raw body under one of the keys."""
        header = self._header.required(delivery.raw_headers)
        prefix = self._prefix
        if not header.startswith(prefix):
            raise Unauthenticated(f"{self._header.name} does not start with {prefix!r}")
        offered = header[len(prefix) :].strip()
        if self._hex:
            offered = offered.lower()
        encode, body = self._encode, delivery.body
        require_match((encode(mac.digest(body)) for mac in self.macs), [offered], self._mismatch)


def body_hmac(config: BodyHmacConfig) -> BodyHmac | None:
    """The `[hmac]` check of a kind's config, each secret keyed by its algorithm; None
    without an `[hmac]`."""
    if config.hmac is None:
        return None
    return BodyHmac(config.hmac, config.secret_values())


BodyHmacConfigT = TypeVar("BodyHmacConfigT", bound=BodyHmacConfig)


class BodyHmacSource(Source[BodyHmacConfigT]):
    """A kind whose config may add an `[hmac]` check: `verify` runs `_body_hmac` where there
    is one, and its header's value is never stored."""

    @cached_property
    def _body_hmac(self) -> BodyHmac | None:
        return body_hmac(self.config)

    def is_sensitive_header(self, name: str) -> bool:
        return super().is_sensitive_header(name) or self.config.is_hmac_header(name)
