"""Process settings from the environment (docs/configuration.md), checked before any start."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import NoneType, UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

MIB = 1024 * 1024


class ConfigError(Exception):
    """A configuration problem, worded as the one line printed before start-up stops."""


class Settings(BaseSettings):
    """Process settings, from the environment (docs/configuration.md#environment)."""

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
    # for them before ingest answers 503 (backpressure). One: what arrives while a batch is
    # written waits for the next, so batches are larger and their fixed costs (a statement, a
    # commit, a round trip) are shared by more deliveries; two flushers cost 15-30% more CPU
    # per delivery with the database on the same cores (docs/benchmarks-log.md). More help when
    # the database is far away and a commit's round trip dominates.
    ingest_flushers: int = Field(default=1, ge=1, le=32)
    ingest_max_queued: int = Field(default=5000, ge=1)
    # Slow and broken clients: the whole body must arrive within this many seconds (else 408),
    # and a server process takes at most this many concurrent connections (else 503).
    body_timeout_seconds: float = Field(default=30.0, gt=0)
    max_connections: int = Field(default=1000, ge=1)
    # Deliveries refused with a 4xx kept per source for the operator, newest first, at most a
    # day (docs/operating.md#rejected-deliveries).
    rejected_per_source: int = Field(default=500, ge=1, le=100_000)
    # The worker (docs/handlers.md#how-the-worker-runs-handlers): concurrent claim loops,
    # messages per claim, polling fallback period, how long in-flight batches may run on at
    # shutdown, and how long a forward's lease outlives its HTTP timeout.
    worker_concurrency: int = Field(default=4, ge=1, le=256)
    worker_batch_size: int = Field(default=100, ge=1, le=10_000)
    worker_poll_seconds: float = Field(default=2.0, gt=0, le=3600)
    worker_grace_seconds: float = Field(default=30.0, ge=0, le=3600)
    worker_lease_margin_seconds: float = Field(default=30.0, ge=0, le=3600)
    # After a batch began, how long a notification waits before waking a claim loop, so that
    # the deliveries of that time are claimed together (Worker._notified).
    worker_linger_seconds: float = Field(default=0.05, ge=0, le=10)
    # The processing process's niceness (0-19; 0, the default: as ingest's). Raised, ingest's
    # HTTP process comes first for a core while a backlog drains; not shown to help on this
    # project's shared machine (docs/operating.md, bench/backlog --ingest).
    worker_nice: int = Field(default=0, ge=0, le=19)
    # How many of the claim loops run while deliveries are arriving (one was committed in the
    # last second): ingest first. None, the default: half the machine's cores, at least one;
    # worker_concurrency or more: the worker never yields (docs/operating.md).
    worker_ingest_concurrency: int | None = Field(default=None, ge=1, le=256)
    # How long after the last delivery was committed deliveries still count as arriving.
    worker_ingest_quiet_seconds: float = Field(default=1.0, gt=0, le=60)

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


def error_path(*parts: str | int) -> str:
    """`sources.x`, `handlers`, 0, `target` as `sources.x.handlers[0].target`."""
    path = ""
    for part in parts:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part != "":
            path += f".{part}" if path else part
    return path


def did_you_mean(offered: str, choices: Iterable[str]) -> str:
    """` (did you mean X?)` with the choice closest to `offered`, or "" when none is close."""
    close = difflib.get_close_matches(offered, list(choices), n=1)
    return f" (did you mean {close[0]}?)" if close else ""


def _unwrapped(annotation: Any) -> Any:
    """`X` of `Annotated[X, ...]` and of `X | None`."""
    while True:
        origin = get_origin(annotation)
        if origin is Annotated:
            annotation = get_args(annotation)[0]
        elif origin in (Union, UnionType):
            kept = [a for a in get_args(annotation) if a is not NoneType]
            if len(kept) != 1:
                return annotation
            annotation = kept[0]
        else:
            return annotation


def keys_at(model: type[BaseModel], path: Sequence[str | int]) -> list[str]:
    """The keys the table at `path` in a file read as `model` may have: through its models'
    fields, a list's entries and a dict's values; none where the path leaves the models."""
    current: Any = model
    for part in path:
        current = _unwrapped(current)
        if isinstance(current, type) and issubclass(current, BaseModel):
            field = current.model_fields.get(str(part))
            if field is None:
                return []
            current = field.annotation
        elif get_origin(current) in (list, dict):
            current = get_args(current)[-1]  # `part` is an index or a key
        else:
            return []
    current = _unwrapped(current)
    is_model = isinstance(current, type) and issubclass(current, BaseModel)
    return list(current.model_fields) if is_model else []


def format_validation_error(
    prefix: str, err: ValidationError, model: type[BaseModel] | None = None
) -> str:
    """The first error of `err` as `prefix.field[0].key: message`, the one line a user needs;
    an unknown key of `model` comes with the closest known one, if any is close, and before
    any other error (a misspelt key is also a missing one: the unknown key says which).

    List positions are written `[i]`, as everywhere else a config error names a list entry.
    """
    errors = err.errors()
    first = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    loc = error_path(prefix, *first["loc"])
    message = first["msg"]
    if first["type"] == "extra_forbidden":
        *table, key = first["loc"]
        known = keys_at(model, table) if model is not None else []
        message = "unknown key" + did_you_mean(str(key), known)
    elif message.startswith("Value error, "):
        message = message.removeprefix("Value error, ")
    return f"{loc}: {message}"
