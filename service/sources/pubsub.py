"""Google Cloud Pub/Sub push: the OIDC bearer JWT and/or a query token, deduped on messageId."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field, field_validator, model_validator

from service.core.tracing import carrier_of
from service.sources.base import (
    BadDelivery,
    Message,
    Messages,
    RawDelivery,
    Rejected,
    Source,
    Unauthenticated,
    authorization,
    parse_json,
    require_json_media_type,
)
from service.sources.config import SourceConfig
from service.sources.limits import checked_event_type, checked_message_id

# PyJWT and httpx are imported where the OIDC check needs them: only a source with an
# `audience` does, and every process that loads the sources file would pay for them at start.
if TYPE_CHECKING:
    import jwt

GOOGLE_JWKS_URL = "https://www.googleapis.com/oauth2/v3/certs"
# Google signs push tokens with either spelling of its issuer.
GOOGLE_ISSUERS = ("https://accounts.google.com", "accounts.google.com")
CLOCK_SKEW_SECONDS = 10
# An unknown `kid` refetches the key set (Google rotates keys), but not more often than this.
REFETCH_AFTER_SECONDS = 60.0


class KeysUnavailable(Rejected):
    status = 503
    reason = "keys_unavailable"


def read_jwks_file(path: Path) -> jwt.PyJWKSet:
    import jwt

    try:
        return jwt.PyJWKSet.from_json(path.read_text())
    except (OSError, jwt.PyJWTError, ValueError) as exc:
        raise ValueError(f"jwks_file {path} is not a readable JWKS: {exc}") from exc


class PubSubConfig(SourceConfig):
    audience: str | None = Field(default=None, min_length=1)
    jwks_file: Path | None = None
    jwks_url: str | None = Field(default=None, pattern=r"^https://")
    jwks_cache_seconds: float = Field(default=3600.0, gt=0, le=86_400)
    service_account_email: str | None = Field(default=None, min_length=3)
    event_type_attribute: str | None = Field(default=None, min_length=1)
    # A push endpoint with neither the token nor OIDC accepts messages from anyone who finds
    # it; starting that way takes an explicit opt-in.
    allow_unauthenticated: bool = False

    @field_validator("jwks_file")
    @classmethod
    def _readable(cls, value: Path | None) -> Path | None:
        if value is not None:
            read_jwks_file(value)
        return value

    @model_validator(mode="after")
    def _coherent(self) -> PubSubConfig:
        if self.jwks_file and self.jwks_url:
            raise ValueError("set jwks_file or jwks_url, not both")
        if (self.jwks_file or self.jwks_url or self.service_account_email) and not self.audience:
            raise ValueError("OIDC checks need audience (the push subscription's audience)")
        if self.token is None and self.audience is None and not self.allow_unauthenticated:
            raise ValueError(
                "pubsub needs token and/or audience (OIDC); "
                "set allow_unauthenticated = true to accept unauthenticated pushes"
            )
        return self


class JwksCache:
    """Google's signing keys, from a local file (read once) or a URL (refetched after a TTL)."""

    def __init__(self, file: Path | None, url: str, ttl: float) -> None:
        self.url = url
        self.ttl = ttl
        self.keys: jwt.PyJWKSet | None = None
        self.fetched_at = 0.0
        self.fixed = file is not None
        self.lock = asyncio.Lock()
        if file is not None:
            self.keys = read_jwks_file(file)

    async def key(self, kid: str) -> jwt.PyJWK:
        keys = await self._current(refresh=False)
        try:
            return keys[kid]
        except KeyError:
            pass
        if not self.fixed and time.monotonic() - self.fetched_at > REFETCH_AFTER_SECONDS:
            keys = await self._current(refresh=True)
            try:
                return keys[kid]
            except KeyError:
                pass
        raise Unauthenticated("the bearer token's key id is not among the configured keys")

    async def _current(self, *, refresh: bool) -> jwt.PyJWKSet:
        if self.fixed:
            assert self.keys is not None
            return self.keys
        async with self.lock:
            stale = time.monotonic() - self.fetched_at > self.ttl
            if self.keys is None or stale or refresh:
                self.keys = await self._fetch()
                self.fetched_at = time.monotonic()
            return self.keys

    async def _fetch(self) -> jwt.PyJWKSet:
        import httpx
        import jwt

        try:
            async with httpx.AsyncClient(timeout=10.0) as client:
                response = await client.get(self.url)
                response.raise_for_status()
            return jwt.PyJWKSet.from_json(response.text)
        except (httpx.HTTPError, jwt.PyJWTError, ValueError) as exc:
            if self.keys is not None:
                return self.keys  # keep verifying with the keys we had
            raise KeysUnavailable(f"could not fetch the OIDC keys from {self.url}") from exc


class PubSubSource(Source[PubSubConfig]):
    kind = "pubsub"
    # A push subscription redelivers an unacknowledged message until the subscription's
    # message retention ends: at most 7 days.
    redelivery_days = 7.0

    def __init__(self, name: str, config: PubSubConfig) -> None:
        super().__init__(name, config)
        self.jwks = (
            JwksCache(
                config.jwks_file, config.jwks_url or GOOGLE_JWKS_URL, config.jwks_cache_seconds
            )
            if config.audience
            else None
        )
        # What `verify` reads of the config on every delivery, read once (see `Source`).
        self._event_type_attribute = config.event_type_attribute
        self._audience = config.audience
        self._service_account_email = config.service_account_email

    async def verify(self, delivery: RawDelivery) -> Messages:
        if self.jwks is not None:
            await self._check_oidc(delivery, self.jwks)
        require_json_media_type(delivery)
        envelope = parse_json(delivery.body)
        message = envelope.get("message") if isinstance(envelope, dict) else None
        if not isinstance(message, dict):
            raise BadDelivery("missing message: expected a Pub/Sub push envelope")
        message_id = checked_message_id(
            message.get("messageId") or message.get("message_id"), "the field message.messageId"
        )
        return Messages(
            [Message(message_id, self._event_type(message), trace_context=carried_trace(message))]
        )

    def _event_type(self, message: dict[str, Any]) -> str | None:
        name = self._event_type_attribute
        if name is None:
            return None
        attributes = message.get("attributes")
        value = attributes.get(name) if isinstance(attributes, dict) else None
        return checked_event_type(value, f"the field message.attributes.{name}")

    async def _check_oidc(self, delivery: RawDelivery, jwks: JwksCache) -> None:
        import jwt

        scheme, token = authorization(delivery)
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthenticated("missing Authorization: Bearer OIDC token")
        token = token.strip()
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            raise Unauthenticated("the bearer token is not a JWT") from None
        if header.get("alg") != "RS256":
            raise Unauthenticated("the bearer token is not signed with RS256")
        kid = header.get("kid")
        if not isinstance(kid, str):
            raise Unauthenticated("the bearer token has no key id (kid)")
        key = await jwks.key(kid)
        try:
            claims = jwt.decode(
                token,
                key,
                algorithms=["RS256"],
                audience=self._audience,
                issuer=GOOGLE_ISSUERS,
                leeway=CLOCK_SKEW_SECONDS,
                options={"require": ["exp", "iat", "iss", "aud"]},
            )
        except jwt.ExpiredSignatureError:
            raise Unauthenticated("the bearer token has expired") from None
        except jwt.InvalidAudienceError:
            raise Unauthenticated("the bearer token's audience is not the configured one") from None
        except jwt.InvalidIssuerError:
            raise Unauthenticated("the bearer token's issuer is not accounts.google.com") from None
        except jwt.PyJWTError as exc:
            raise Unauthenticated(f"the bearer token does not verify: {exc}") from None
        expected_email = self._service_account_email
        if expected_email is not None and (
            claims.get("email") != expected_email or claims.get("email_verified") is not True
        ):
            raise Unauthenticated("the bearer token is not for the configured service account")


def carried_trace(message: dict[str, Any]) -> dict[str, str] | None:
    """The trace context in the message's attributes: `googclient_traceparent` as Google's
    client libraries write it with OpenTelemetry on, or a plain `traceparent`."""
    attributes = message.get("attributes")
    if not isinstance(attributes, dict):
        return None
    return carrier_of(
        {
            "traceparent": attributes.get("googclient_traceparent")
            or attributes.get("traceparent"),
            "tracestate": attributes.get("googclient_tracestate") or attributes.get("tracestate"),
        }
    )
