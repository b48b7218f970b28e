"""The sources file's models: a source's keys, its handlers and forward, and retention."""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    ValidationInfo,
)
from standardwebhooks.webhooks import Webhook

from service.core.settings import ConfigError, did_you_mean
from service.sources.filters import PayloadFilter
from service.sources.jsonpointer import validate_pointer

# Values people leave in a config file meaning "fill me in"; starting with one would make
# every delivery verify against a guessable key.
_PLACEHOLDERS = frozenset(
    {"changeme", "change-me", "change_me", "secret", "password", "xxx", "todo", "replace-me"}
)


class UnsetVariable(ValueError):
    """`env:NAME` names a variable that is not set."""

    def __init__(self, variable: str) -> None:
        super().__init__(f"environment variable {variable} is not set")
        self.variable = variable


def resolve_secret(value: Any) -> Any:
    """Read `env:NAME` from the environment and refuse empty or placeholder secrets."""
    if isinstance(value, SecretStr):
        value = value.get_secret_value()
    if not isinstance(value, str):
        return value
    if value.startswith("env:"):
        name = value[4:]
        if not name:
            raise ValueError("'env:' needs a variable name, as in env:STRIPE_WEBHOOK_SECRET")
        if name not in os.environ:
            raise UnsetVariable(name)
        value = os.environ[name]
        if not value.strip():
            raise ValueError(f"environment variable {name} is empty")
    if not value.strip():
        raise ValueError("secret is empty")
    if value.strip().lower() in _PLACEHOLDERS or value.startswith("<"):
        raise ValueError("secret is a placeholder; set a real value")
    return value


# The validation context of a sources file read for a command that verifies and signs for no
# source (pause, messages, prune...): an `env:` secret whose variable is unset is kept as an
# `UnsetSecret` instead of refused, so that such a command needs no source's secret.
LAZY_SECRETS = {"secrets": "lazy"}


class UnsetSecret(SecretStr):
    """An `env:NAME` secret whose variable was not set when the file was read with
    LAZY_SECRETS. Reading it fails as `serve` does at start (`InboxConfig.require_secrets`
    says where, before anything reads it)."""

    def __init__(self, variable: str) -> None:
        super().__init__("")
        self.variable = variable

    def get_secret_value(self) -> str:
        raise ConfigError(f"environment variable {self.variable} is not set")


def configured_secret(value: Any, info: ValidationInfo) -> Any:
    """`resolve_secret`, keeping an unset variable as an `UnsetSecret` under LAZY_SECRETS."""
    try:
        return resolve_secret(value)
    except UnsetVariable as exc:
        if info.context != LAZY_SECRETS:
            raise
        return UnsetSecret(exc.variable)


def is_set(secret: SecretStr | None) -> bool:
    """Whether a validator can read `secret`'s value (it is given and not an `UnsetSecret`)."""
    return secret is not None and not isinstance(secret, UnsetSecret)


def secret_text(secret: SecretStr | None) -> str | None:
    """An optional secret's text, None when it is not configured; an `UnsetSecret` raises
    here, where the source needs it, not when the config is read."""
    return None if secret is None else secret.get_secret_value()


Secret = Annotated[SecretStr, BeforeValidator(configured_secret)]

_TARGET = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")


def check_target(value: str) -> str:
    """A handler is named `module:function`; say so in those words when it is not."""
    if _TARGET.fullmatch(value):
        return value
    module, dot, function = value.rpartition(".")
    hint = did_you_mean(value, [f"{module}:{function}"]) if dot and ":" not in value else ""
    raise ValueError(
        f"write a handler as module:function, as in myapp.billing:on_payment, not {value!r}{hint}"
    )


HandlerTarget = Annotated[str, AfterValidator(check_target)]


class HandlerSpec(BaseModel):
    """One `[[sources.X.handler]]` entry: a `module:function` for the event types it matches,
    and, with `payload`, only for the bodies that filter passes (service/sources/filters.py)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    target: HandlerTarget
    event_types: list[str] = Field(default_factory=lambda: ["*"], min_length=1)
    payload: PayloadFilter | None = None


class ForwardConfig(BaseModel):
    """`[sources.X.forward]`: deliver each message to an internal HTTP endpoint."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: Annotated[str, Field(pattern=r"^https?://")]
    timeout_seconds: float = Field(default=10.0, gt=0, le=300)
    # The circuit breaker (a source's forward, or a named destination's): after this many
    # failures in a row (connection errors, timeouts, 5xx) the endpoint is left alone for the
    # cool-down, its messages waiting without spending attempts, then one probe decides. It
    # also bounds the forwards of one claim, so that an endpoint going down costs at most this
    # many attempts.
    breaker_failures: int = Field(default=20, ge=1, le=1000)
    breaker_cooldown_seconds: float = Field(default=30.0, gt=0, le=3600)


DESTINATION_NAME = r"^[a-z0-9][a-z0-9_-]{0,63}$"
_RATE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*/\s*(s|m)\s*")


class RateLimit(BaseModel):
    """`rate_limit = "100/s"` (or `"/m"`): how many of a source's messages may be claimed per
    second, by every process on the database together. Bursts are bounded by the bucket: at
    most one second's worth (at least one message) at once."""

    model_config = ConfigDict(frozen=True)

    per_second: float
    text: str

    @property
    def burst(self) -> float:
        return max(1.0, self.per_second)


def parse_rate_limit(value: Any) -> Any:
    if isinstance(value, RateLimit):
        return value
    if not isinstance(value, str):
        raise ValueError(f'write a rate limit as a string, as in "100/s", not {value!r}')
    match = _RATE.fullmatch(value)
    if match is None:
        raise ValueError(
            'write a rate limit as a count per second or minute, as in "100/s" or "30/m", '
            f"not {value!r}"
        )
    count = float(match.group(1))
    if count <= 0:
        raise ValueError(f"a rate limit must be above zero, not {value!r}")
    per_second = count if match.group(2) == "s" else count / 60
    if per_second > 100_000:
        raise ValueError(f"a rate limit is at most 100000/s, not {value!r}")
    return RateLimit(per_second=per_second, text=value.strip())


HEADER_PREFIX = "header:"
_HTTP_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")


def check_ordering_key(value: str) -> str:
    """`/a/json/pointer` into the body, or `header:Name`: refused at start otherwise."""
    if value.startswith(HEADER_PREFIX):
        name = value[len(HEADER_PREFIX) :]
        if not _HTTP_TOKEN.fullmatch(name):
            raise ValueError(f"{name!r} is not a header name (header:X-Shop-Domain)")
        return HEADER_PREFIX + name.lower()
    if not value.startswith("/"):
        raise ValueError(
            "an ordering key is a JSON pointer into the body (/data/object/customer) or a "
            "header (header:X-Shop-Domain)"
        )
    return validate_pointer(value)


class DestinationConfig(BaseModel):
    """`[sources.X.destinations.NAME]`: one destination of a source's messages, with its own
    filter and its own delivery state (attempts, status, dead letters). Either Python handlers
    (`handlers`, `handler` entries; their effects commit with this destination's processed
    mark) or `forward`, an HTTP endpoint."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    event_types: list[str] = Field(default_factory=lambda: ["*"], min_length=1)
    payload: PayloadFilter | None = None
    handlers: list[HandlerTarget] = Field(default_factory=list)
    handler: list[HandlerSpec] = Field(default_factory=list)
    forward: ForwardConfig | None = None
    # Messages this destination runs per second (by every process together): those over it
    # wait, spending no attempt; the source's other destinations are not held.
    rate_limit: Annotated[RateLimit, BeforeValidator(parse_rate_limit)] | None = None


class SourceConfig(BaseModel):
    """Keys every kind accepts; a kind's module subclasses this with its own keys."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: str
    secrets: list[Secret] = Field(default_factory=list)
    token: Secret | None = None
    tolerance_seconds: int = Field(default=300, ge=1, le=86_400)
    mode: Literal["async", "sync"] = "async"
    max_attempts: int = Field(default=10, ge=1, le=1000)
    # A hung handler would hold its batch's transaction (and row locks) for ever: past this,
    # its attempt fails and is retried like any other failure.
    handler_timeout_seconds: float = Field(default=60.0, gt=0, le=3600)
    backoff_base_seconds: float = Field(default=2.0, gt=0, le=86_400)
    backoff_max_seconds: float = Field(default=3600.0, gt=0, le=7 * 86_400)
    handlers: list[HandlerTarget] = Field(default_factory=list)
    handler: list[HandlerSpec] = Field(default_factory=list)
    forward: ForwardConfig | None = None
    # Messages with the same key are processed one at a time, in the order they were accepted
    # (`/json/pointer` or `header:Name`; a message without the key is unordered).
    ordering_key: Annotated[str, AfterValidator(check_ordering_key)] | None = None
    # Messages claimed per second (by every process on the database together): those over it
    # wait as `pending`, spending no attempt.
    rate_limit: Annotated[RateLimit, BeforeValidator(parse_rate_limit)] | None = None
    # Named destinations, each with its own filter and state; instead of the three keys
    # above, which are one destination without a name (checked in `build_pipeline`).
    destinations: dict[Annotated[str, Field(pattern=DESTINATION_NAME)], DestinationConfig] = Field(
        default_factory=dict
    )
    # Its messages' JSON payloads are indexed for search (`contains`, `where`, `q`): opt-in,
    # since the index costs ingest about half its rate (docs/search.md#what-each-costs).
    search_payload: bool = False

    def secret_values(self) -> list[bytes]:
        return [s.get_secret_value().encode() for s in self.secrets]


def check_signing_secret(value: SecretStr) -> SecretStr:
    """A Standard Webhooks signing secret: `whsec_` and the base64 of the key, as the
    `standardwebhooks` package reads it; refused at start-up otherwise."""
    if not is_set(value):
        return value
    try:
        Webhook(value.get_secret_value())
    except Exception:
        raise ValueError(
            "a signing secret is whsec_ followed by base64, as in whsec_"
            "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
        ) from None
    return value


# The outbox's outgoing messages to an endpoint are rows of `inbox_messages` under this source
# (a source's own name has no ':'), so that they live as incoming messages do (docs/outbox.md).
ENDPOINT_SOURCE_PREFIX = "outbox:"


def endpoint_source(endpoint: str) -> str:
    """The source of an endpoint's outgoing messages (their rows' `source`)."""
    return ENDPOINT_SOURCE_PREFIX + endpoint


def endpoint_of(source: str) -> str | None:
    """The endpoint whose outgoing messages `source` holds; None for incoming messages."""
    if source.startswith(ENDPOINT_SOURCE_PREFIX):
        return source[len(ENDPOINT_SOURCE_PREFIX) :]
    return None


class EndpointConfig(ForwardConfig):
    """`[endpoints.NAME]`: an HTTP endpoint that outgoing messages (`ctx.outbox.send`,
    `service.outbox.send`) are delivered to, at least once, each with a stable
    `Idempotency-Key` and `webhook-id` and, with `secret`, a Standard Webhooks signature
    (docs/outbox.md). Its own retry policy and gates, as a source's forward has."""

    # `whsec_...` or `env:NAME`: each request is signed with it (`webhook-signature`).
    secret: Annotated[Secret, AfterValidator(check_signing_secret)] | None = None
    rate_limit: Annotated[RateLimit, BeforeValidator(parse_rate_limit)] | None = None
    max_attempts: int = Field(default=10, ge=1, le=1000)
    backoff_base_seconds: float = Field(default=2.0, gt=0, le=86_400)
    backoff_max_seconds: float = Field(default=3600.0, gt=0, le=7 * 86_400)
    # A sent (or dead) outgoing message's key is kept at least this long whatever
    # `[retention]` says: staging the same key again within it sends nothing twice.
    keep_keys_days: float = Field(default=7.0, gt=0, le=3650)

    def source_config(self) -> SourceConfig:
        """The retry policy and gates of the endpoint's outgoing messages, as the worker reads
        a source's (their rows are a source's, `service.outbox.endpoint_source`)."""
        return SourceConfig(
            kind="outbox",
            max_attempts=self.max_attempts,
            backoff_base_seconds=self.backoff_base_seconds,
            backoff_max_seconds=self.backoff_max_seconds,
            forward=self,
            rate_limit=self.rate_limit,
        )


def unset_secrets(model: BaseModel) -> list[str]:
    """Each secret of `model` read lazily whose variable is unset, as `secrets[0]: environment
    variable X is not set` (secrets are top-level keys of a source and of `[alerts]`)."""
    found = []
    for key in type(model).model_fields:
        value = getattr(model, key)
        entries = enumerate(value) if isinstance(value, list) else [(None, value)]
        for i, entry in entries:
            if isinstance(entry, UnsetSecret):
                where = key if i is None else f"{key}[{i}]"
                found.append(f"{where}: environment variable {entry.variable} is not set")
    return found


class RetentionConfig(BaseModel):
    """`[retention]`: how long processed, discarded and dead rows are kept."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    processed_days: float = Field(default=30, gt=0)
    dead_days: float | None = Field(default=None, gt=0)


def check_webhook_url(value: SecretStr) -> SecretStr:
    """An `http://` or `https://` URL with a host, to any address (loopback and private ones
    too: the operator names it, as a forward's URL). Refused at start-up otherwise, in words
    that never repeat the URL, which is a credential."""
    if not is_set(value):
        return value
    url = value.get_secret_value()
    if not url.lower().startswith(("https://", "http://")):
        raise ValueError("an alert webhook is an http:// or https:// URL")
    if any(c.isspace() or not c.isprintable() for c in url):
        raise ValueError("an alert webhook URL cannot contain spaces or control characters")
    try:
        parts = urlsplit(url)
        port = parts.port  # reading it checks it: a number, 0-65535
    except ValueError:
        raise ValueError("an alert webhook URL's host or port cannot be read") from None
    if not parts.hostname:
        raise ValueError("an alert webhook URL needs a host, as in https://hooks.slack.com/...")
    if port == 0:
        raise ValueError("an alert webhook URL's port is 1-65535")
    return value


class AlertsConfig(BaseModel):
    """`[alerts]`: webhooks told when messages go dead, one notice per source per interval."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # URLs, or `env:NAME`: a Slack incoming webhook's URL is itself the credential.
    webhooks: list[Annotated[Secret, AfterValidator(check_webhook_url)]] = Field(
        default_factory=list
    )
    # "slack": {"text": ...}, as Slack's incoming webhooks (and Mattermost's) read it; "json"
    # adds the source, the count and the first messages as fields beside the text.
    format: Literal["slack", "json"] = "slack"
    interval_seconds: float = Field(default=60.0, ge=1)
    max_errors: int = Field(default=3, ge=1, le=50)
    # Tries of one notice within a pass, with exponential backoff between them; a notice
    # still undelivered is tried again after interval_seconds.
    send_attempts: int = Field(default=4, ge=1, le=20)
    timeout_seconds: float = Field(default=10.0, gt=0, le=120)


def read_toml(path: Path, *, required: bool = False) -> dict[str, Any]:
    """Parse the sources file; a missing one is an empty configuration unless `required`."""
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        if required:
            raise ConfigError(
                f"{path}: no such file (INBOX_CONFIG names it; unset INBOX_CONFIG to start "
                "without sources)"
            ) from None
        return {}
    except IsADirectoryError:
        # What `docker compose` mounts when the file it was told to mount does not exist.
        raise ConfigError(f"{path}: is a directory, not a TOML file") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from exc
