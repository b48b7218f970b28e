"""Process settings (environment) and the sources file (TOML), validated before anything starts."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
)
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

MIB = 1024 * 1024
# Request line plus headers. Providers send a few KiB; more is refused with 431 (or 400).
MAX_REQUEST_HEAD_BYTES = 64 * 1024
# From a connection's start, or its previous response, until its next head is complete.
# Providers send a head in one write; a client slower than this only holds a socket.
REQUEST_HEAD_TIMEOUT_SECONDS = 10.0

# Values people leave in a config file meaning "fill me in"; starting with one would make
# every delivery verify against a guessable key.
_PLACEHOLDERS = frozenset(
    {"changeme", "change-me", "change_me", "secret", "password", "xxx", "todo", "replace-me"}
)


class ConfigError(Exception):
    """A configuration problem, worded as the one line printed before start-up stops."""


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
            raise ValueError(f"environment variable {name} is not set")
        value = os.environ[name]
        if not value.strip():
            raise ValueError(f"environment variable {name} is empty")
    if not value.strip():
        raise ValueError("secret is empty")
    if value.strip().lower() in _PLACEHOLDERS or value.startswith("<"):
        raise ValueError("secret is a placeholder; set a real value")
    return value


Secret = Annotated[SecretStr, BeforeValidator(resolve_secret)]


class HandlerSpec(BaseModel):
    """One `[[sources.X.handler]]` entry: a `module:function` for the event types it matches."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    target: str = Field(pattern=r"^[\w.]+:[\w]+$")
    event_types: list[str] = Field(default_factory=lambda: ["*"], min_length=1)


class ForwardConfig(BaseModel):
    """`[sources.X.forward]`: deliver each message to an internal HTTP endpoint."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: Annotated[str, Field(pattern=r"^https?://")]
    timeout_seconds: float = Field(default=10.0, gt=0, le=300)


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
    handlers: list[Annotated[str, Field(pattern=r"^[\w.]+:[\w]+$")]] = Field(default_factory=list)
    handler: list[HandlerSpec] = Field(default_factory=list)
    forward: ForwardConfig | None = None

    def secret_values(self) -> list[bytes]:
        return [s.get_secret_value().encode() for s in self.secrets]


class RetentionConfig(BaseModel):
    """`[retention]`: how long processed, discarded and dead rows are kept."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    processed_days: float = Field(default=30, gt=0)
    dead_days: float | None = Field(default=None, gt=0)


class Settings(BaseSettings):
    """Process settings, from the environment (SPEC §2)."""

    model_config = SettingsConfigDict(env_prefix="INBOX_", extra="ignore", populate_by_name=True)

    database_url: str | None = Field(default=None, validation_alias="DATABASE_URL")
    config: Path = Path("inbox.toml")
    data_dir: Path = Path(".inbox")
    admin_tokens: Annotated[list[SecretStr], NoDecode] = Field(default_factory=list)
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=1, le=65535)
    max_body_bytes: int = Field(default=MIB, ge=1024)
    log_level: str = "INFO"
    log_format: Literal["json", "text"] = "json"
    db_pool_size: int = Field(default=10, ge=1, le=200)
    db_timeout_seconds: float = Field(default=5.0, gt=0)
    # Group commit: transactions writing deliveries at once, and deliveries allowed to wait
    # for them before ingest answers 503 (backpressure).
    ingest_flushers: int = Field(default=2, ge=1, le=32)
    ingest_max_queued: int = Field(default=5000, ge=1)
    # Slow and broken clients: the whole body must arrive within this many seconds (else 408),
    # and a server process takes at most this many concurrent connections (else 503).
    body_timeout_seconds: float = Field(default=30.0, gt=0)
    max_connections: int = Field(default=1000, ge=1)
    # The worker (SPEC §5): concurrent claim loops, messages per claim, polling fallback period,
    # how long in-flight batches may run on at shutdown, and how long a forward's lease outlives
    # its HTTP timeout.
    worker_concurrency: int = Field(default=4, ge=1, le=256)
    worker_batch_size: int = Field(default=100, ge=1, le=10_000)
    worker_poll_seconds: float = Field(default=2.0, gt=0, le=3600)
    worker_grace_seconds: float = Field(default=30.0, ge=0, le=3600)
    worker_lease_margin_seconds: float = Field(default=30.0, ge=0, le=3600)

    @property
    def config_is_set(self) -> bool:
        """Whether INBOX_CONFIG (or the caller) named the sources file: then it must exist."""
        return "config" in self.model_fields_set

    @field_validator("admin_tokens", mode="before")
    @classmethod
    def _split_tokens(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [t.strip() for t in value.split(",") if t.strip()]
        return value

    @field_validator("database_url")
    @classmethod
    def _empty_is_unset(cls, value: str | None) -> str | None:
        return value or None


def format_validation_error(prefix: str, err: ValidationError) -> str:
    """The first error of `err` as `prefix.field: message`, the one line a user needs."""
    first = err.errors()[0]
    loc = ".".join(str(p) for p in (prefix, *first["loc"]) if p != "")
    message = first["msg"]
    if first["type"] == "extra_forbidden":
        message = "unknown key"
    elif message.startswith("Value error, "):
        message = message.removeprefix("Value error, ")
    return f"{loc}: {message}"


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
