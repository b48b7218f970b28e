"""A configurable HMAC of the raw body (`[sources.X.hmac]`) for kinds without a scheme."""

from __future__ import annotations

import base64
import hashlib
import hmac
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from service.sources.base import RawDelivery, Unauthenticated
from service.sources.config import SourceConfig
from service.sources.signing import KeyedHmac, keyed_macs, require_match

_DIGESTS = {"sha1": hashlib.sha1, "sha256": hashlib.sha256, "sha512": hashlib.sha512}


class HmacConfig(BaseModel):
    """`[sources.X.hmac]`: the header carrying an HMAC of the raw body, and how it is written."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    header: str = Field(min_length=1)
    algorithm: Literal["sha1", "sha256", "sha512"] = "sha256"
    encoding: Literal["hex", "base64"] = "hex"
    prefix: str = ""


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


def _encoded(digest: bytes, spec: HmacConfig) -> str:
    return digest.hex() if spec.encoding == "hex" else base64.b64encode(digest).decode()


def body_macs(config: BodyHmacConfig) -> list[KeyedHmac]:
    """The keyed HMAC of each secret, by `[hmac]`'s algorithm; none without an `[hmac]`."""
    if config.hmac is None:
        return []
    return keyed_macs(config.secret_values(), _DIGESTS[config.hmac.algorithm])


def check_body_hmac(delivery: RawDelivery, spec: HmacConfig, macs: list[KeyedHmac]) -> None:
    """401 unless `spec.header` carries the HMAC of the raw body under one of `macs`' keys."""
    header = delivery.headers.get(spec.header)
    if not header:
        raise Unauthenticated(f"missing {spec.header} header")
    if not header.startswith(spec.prefix):
        raise Unauthenticated(f"{spec.header} does not start with {spec.prefix!r}")
    offered = header[len(spec.prefix) :].strip()
    if spec.encoding == "hex":
        offered = offered.lower()
    require_match(
        (_encoded(mac.digest(delivery.body), spec) for mac in macs),
        [offered],
        f"{spec.header} does not match a configured secret",
    )
