"""The sources file: each `[sources.X]` table built into a verified `Source`."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from service.core.settings import ConfigError, did_you_mean, format_validation_error
from service.sources import KINDS
from service.sources.base import AnySource
from service.sources.config import (
    DESTINATION_NAME,
    LAZY_SECRETS,
    AlertsConfig,
    EndpointConfig,
    RetentionConfig,
    endpoint_source,
    read_toml,
    unset_secrets,
)

_SOURCE_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-_")
TOP_LEVEL_KEYS = ("sources", "endpoints", "retention", "alerts")


@dataclass(frozen=True)
class InboxConfig:
    """What the sources file says: the sources by name, the outbox's endpoints by name,
    retention, and dead-letter alerts."""

    sources: Mapping[str, AnySource] = field(default_factory=dict)
    endpoints: Mapping[str, EndpointConfig] = field(default_factory=dict)
    retention: RetentionConfig = field(default_factory=RetentionConfig)
    alerts: AlertsConfig = field(default_factory=AlertsConfig)

    @property
    def row_sources(self) -> list[str]:
        """The sources of the rows this configuration owns: its sources' incoming messages,
        then its endpoints' outgoing ones (`outbox:NAME`, `service.outbox`)."""
        return [*self.sources, *map(endpoint_source, self.endpoints)]

    def warnings(self) -> dict[str, str]:
        """Each source's `start_warning` (a `generic` one that checks nothing), by name."""
        return {
            name: warning
            for name, source in self.sources.items()
            if (warning := source.start_warning()) is not None
        }

    def require_secrets(self, sources: Iterable[str] | None = None) -> None:
        """Refuse a source of `sources` (by default every one, and `[alerts]`) with a secret
        whose `env:` variable is unset: where a source is verified or signed for. A file read
        with `lazy_secrets` has such secrets; one read without has refused them already."""
        names = self.sources if sources is None else sources
        for name in names:
            for unset in unset_secrets(self.sources[name].config):
                raise ConfigError(f"sources.{name}.{unset}")
        for name, endpoint in self.endpoints.items() if sources is None else []:
            for unset in unset_secrets(endpoint):
                raise ConfigError(f"endpoints.{name}.{unset}")
        for unset in unset_secrets(self.alerts) if sources is None else []:
            raise ConfigError(f"alerts.{unset}")


def build_source(name: str, table: Any, *, lazy_secrets: bool = False) -> AnySource:
    """Validate one `[sources.NAME]` table with its kind's own model and build the source."""
    where = f"sources.{name}"
    if not name or not set(name) <= _SOURCE_NAME_CHARS:
        raise ConfigError(f"{where}: a source name uses only a-z, 0-9, '-' and '_'")
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: must be a table")
    kind = table.get("kind")
    if kind is None:
        raise ConfigError(f"{where}.kind: missing; one of {', '.join(sorted(KINDS))}")
    cls = KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ConfigError(f"{where}.kind: unknown kind {kind!r}; one of {', '.join(sorted(KINDS))}")
    try:
        config = cls.config_model.model_validate(table, context=lazy(lazy_secrets))
    except ValidationError as exc:
        raise ConfigError(format_validation_error(where, exc, cls.config_model)) from None
    return cls(name, config)


def build_endpoint(name: str, table: Any, *, lazy_secrets: bool = False) -> EndpointConfig:
    """Validate one `[endpoints.NAME]` table."""
    where = f"endpoints.{name}"
    if not re.fullmatch(DESTINATION_NAME, name):
        raise ConfigError(
            f"{where}: an endpoint name is 1-64 of a-z, 0-9, '-' and '_', starting with a "
            "letter or digit"
        )
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: must be a table")
    try:
        return EndpointConfig.model_validate(table, context=lazy(lazy_secrets))
    except ValidationError as exc:
        raise ConfigError(format_validation_error(where, exc, EndpointConfig)) from None


def unconfigured_source_floor_days() -> float:
    """The redelivery floor for rows of a source no longer configured: the longest of any kind."""
    return max(cls.redelivery_days for cls in KINDS.values())


def _days(value: float) -> str:
    return f"{value:g} day" + ("" if value == 1 else "s")


def check_retention_floors(sources: Mapping[str, AnySource], retention: RetentionConfig) -> None:
    """Refuse a retention shorter than a source's redelivery window.

    Pruning a row while its sender may still redeliver the message removes its dedup key, and
    the redelivery would be accepted and processed a second time.
    """
    for name, source in sources.items():
        floor = source.redelivery_days
        for key, days in (
            ("processed_days", retention.processed_days),
            ("dead_days", retention.dead_days),
        ):
            if days is not None and days < floor:
                raise ConfigError(
                    f"retention.{key}: {_days(days)} is shorter than the {_days(floor)} a "
                    f"{source.kind} sender may redeliver a message (source {name!r}); pruning "
                    f"sooner would let a redelivery be processed twice, so set at least {floor:g}"
                )


def lazy(lazy_secrets: bool) -> dict[str, str] | None:
    return LAZY_SECRETS if lazy_secrets else None


def named_tables(raw: Mapping[str, Any], key: str) -> dict[str, Any]:
    """The `[KEY.NAME]` tables of the document, by name (each checked by its builder)."""
    tables = raw.get(key, {})
    if not isinstance(tables, dict):
        raise ConfigError(f"{key}: must be a table of [{key}.NAME] tables")
    return tables


def parse_inbox_config(raw: Mapping[str, Any], *, lazy_secrets: bool = False) -> InboxConfig:
    """Build the configuration from a parsed TOML document.

    With `lazy_secrets`, an `env:` secret whose variable is unset is not refused here but by
    `InboxConfig.require_secrets`, for a command that verifies or signs for few sources or
    none (docs/configuration.md#secrets).
    """
    unknown = sorted(set(raw) - set(TOP_LEVEL_KEYS))
    if unknown:
        raise ConfigError(f"{unknown[0]}: unknown key{did_you_mean(unknown[0], TOP_LEVEL_KEYS)}")
    sources = {
        name: build_source(name, table, lazy_secrets=lazy_secrets)
        for name, table in named_tables(raw, "sources").items()
    }
    endpoints = {
        name: build_endpoint(name, table, lazy_secrets=lazy_secrets)
        for name, table in named_tables(raw, "endpoints").items()
    }
    try:
        retention = RetentionConfig.model_validate(raw.get("retention", {}))
    except ValidationError as exc:
        raise ConfigError(format_validation_error("retention", exc, RetentionConfig)) from None
    check_retention_floors(sources, retention)
    try:
        alerts = AlertsConfig.model_validate(raw.get("alerts", {}), context=lazy(lazy_secrets))
    except ValidationError as exc:
        raise ConfigError(format_validation_error("alerts", exc, AlertsConfig)) from None
    return InboxConfig(sources=sources, endpoints=endpoints, retention=retention, alerts=alerts)


def load_inbox_config(
    path: Path, *, required: bool = False, lazy_secrets: bool = False
) -> InboxConfig:
    """Read and build the sources file at `path`; each error names the file, source and field.

    A missing file is no sources unless `required` (INBOX_CONFIG named it): a mistyped path
    must not start a service that answers every delivery 404.
    """
    try:
        return parse_inbox_config(read_toml(path, required=required), lazy_secrets=lazy_secrets)
    except ConfigError as exc:
        message = str(exc)
        raise ConfigError(
            message if message.startswith(str(path)) else f"{path}: {message}"
        ) from None
