"""What every process of the `webhook-inbox` command reads first: its settings, its sources
and their handlers, with a configuration fault ending it in one line.

Below the command line (service/cli.py) and what it runs (service/serve.py, the worker):
each of them calls `load`, none of them imports the parser.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

# What loading needs is imported when it runs: `--help` and `--version` import this module.
if TYPE_CHECKING:
    from service.core.settings import Settings
    from service.processing.pipeline import Pipeline
    from service.sources.config_file import InboxConfig


def load(
    settings_only: bool = False,
    role: str = "cli",
    *,
    handlers: bool = True,
    tracing: bool = True,
    lazy_secrets: bool = False,
    **overrides: Any,
) -> tuple[Settings, InboxConfig, dict[str, Pipeline]]:
    """Settings, sources and their imported handlers, or exit 1 with one line naming the fault.

    `role` is stamped on every log line of this process (supervisor, http, processing, cli).
    Without `handlers`, no handler module is imported (and the pipelines are empty); without
    `tracing`, OTEL_* is not read; with `lazy_secrets`, an unset `env:` secret is left for
    `InboxConfig.require_secrets` (a command that verifies and signs for no source).
    """
    from pydantic import ValidationError

    from service.core import tracing as traces
    from service.core.logging import configure_logging
    from service.core.settings import ConfigError, Settings, format_validation_error
    from service.processing.pipeline import resolve_pipelines
    from service.sources.config_file import InboxConfig, load_inbox_config

    try:
        settings = Settings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        raise SystemExit(f"config error: {format_validation_error('env', exc)}") from None
    configure_logging(settings.log_level, settings.log_format, role=role)
    try:
        if tracing:
            traces.configure_from_environment(role)
    except ValueError as exc:
        raise SystemExit(f"config error: {exc}") from None
    if settings_only:
        return settings, InboxConfig(), {}
    try:
        inbox = load_inbox_config(
            Path(settings.config), required=settings.config_is_set, lazy_secrets=lazy_secrets
        )
    except ConfigError as exc:
        raise SystemExit(f"config error: {exc}") from None
    if not handlers:
        return settings, inbox, {}
    try:
        pipelines = resolve_pipelines(inbox)
    except ConfigError as exc:
        raise SystemExit(f"config error: {settings.config}: {exc}") from None
    return settings, inbox, pipelines
