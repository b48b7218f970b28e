"""`webhook-inbox send SOURCE`: post a delivery the source's kind accepts, and show the answer."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from service.commands.outcome import CommandError, Exit
from service.commands.parsers import command_parser

# The kinds, the settings and httpx are imported when `send` runs, not when the parser is
# built: `webhook-inbox --help` and every other command need none of them.
if TYPE_CHECKING:
    import httpx

    from service.commands.deliveries import Wanted
    from service.core.settings import Settings
    from service.sources.config_file import InboxConfig

DESCRIPTION = """
Build a delivery that SOURCE's kind accepts (its headers and envelope, signed with its first
secret, its token if it has one), post it to the running service and print the answer. What
`stripe trigger` does for one provider, for every kind but sns (only AWS can sign those) and
pubsub sources that check Google's OIDC tokens.
"""

EPILOG = """
SOURCE, its kind and secrets come from the sources file, as `serve` reads it (INBOX_CONFIG,
default inbox.toml; `make run` serves inbox.example.toml when there is no inbox.toml, with
DEMO_WEBHOOK_SECRET=demo-local-secret); only SOURCE's own `env:` secrets need be set. The
same --id sent twice is answered as a duplicate.
Exit status: 0 the service answered 2xx (accepted, duplicate, processed), 1 it answered
otherwise, 2 usage error (unknown source, a kind send cannot sign for), 3 no service answered.
"""


def add_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    send = command_parser(
        commands,
        "send",
        help="post a correctly signed test delivery to a configured source",
        description=DESCRIPTION,
        epilog=EPILOG,
    )
    send.add_argument("source", metavar="SOURCE", help="a source of the sources file")
    send.add_argument(
        "--file",
        metavar="PATH",
        help="JSON to send ('-' reads stdin): the body, or the event's data for the kinds "
        "that wrap events (pubsub, eventgrid, cloudevents, dapr); default: a small test event",
    )
    send.add_argument("--id", help="the message id (the dedup key); default: a new one")
    send.add_argument("--event-type", help="the event type; default: one the kind would send")
    send.add_argument(
        "--url",
        help="the service's base URL (default: http://INBOX_HOST:INBOX_PORT, "
        "http://127.0.0.1:8000 unless set)",
    )
    send.add_argument(
        "--timeout", type=float, default=30.0, help="seconds to wait for the answer (default 30)"
    )
    send.set_defaults(run=run)


def load_sources(settings: Settings) -> InboxConfig:
    from service.core.settings import ConfigError
    from service.sources.config_file import load_inbox_config

    try:
        return load_inbox_config(
            Path(settings.config), required=settings.config_is_set, lazy_secrets=True
        )
    except ConfigError as exc:
        raise CommandError(f"config error: {exc}", Exit.USAGE) from None


def require_secrets(settings: Settings, inbox: InboxConfig, source: str) -> None:
    """The one source a command signs for needs its secrets; the others' may be unset."""
    from service.core.settings import ConfigError

    try:
        inbox.require_secrets([source])
    except ConfigError as exc:
        raise CommandError(f"config error: {settings.config}: {exc}", Exit.USAGE) from None


def read_file(name: str | None) -> Wanted:
    from service.commands.deliveries import Wanted

    if name is None:
        return Wanted()
    try:
        raw = sys.stdin.buffer.read() if name == "-" else Path(name).read_bytes()
    except OSError as exc:
        raise CommandError(f"--file {name}: {exc.strerror}", Exit.USAGE) from None
    try:
        payload = json.loads(raw)
    except ValueError as exc:
        raise CommandError(f"--file {name} is not JSON: {exc}", Exit.USAGE) from None
    return Wanted(payload=payload, raw=raw)


def base_url(settings: Settings, url: str | None) -> str:
    if url:
        return url.rstrip("/")
    host = settings.host
    # Listening on every interface: this machine reaches it on the loopback one.
    if host in ("0.0.0.0", "::", ""):  # noqa: S104 - compared, not bound
        host = "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{settings.port}"


def run(args: argparse.Namespace) -> Exit:
    import httpx
    from pydantic import ValidationError

    from service.commands.deliveries import CannotBuild, Wanted, build_delivery
    from service.core.logging import configure_logging
    from service.core.settings import Settings, format_validation_error

    try:
        settings = Settings()
    except ValidationError as exc:
        message = f"config error: {format_validation_error('env', exc)}"
        raise CommandError(message, Exit.USAGE) from None
    configure_logging("WARNING", settings.log_format, role="cli")
    inbox = load_sources(settings)
    source = inbox.sources.get(args.source)
    if source is None and not Path(settings.config).exists():
        raise CommandError(
            f"no source {args.source!r}: there is no {settings.config} here and INBOX_CONFIG "
            "is unset (`make run` serves inbox.example.toml then: set "
            "INBOX_CONFIG=inbox.example.toml DEMO_WEBHOOK_SECRET=demo-local-secret)",
            Exit.USAGE,
        )
    if source is None:
        known = ", ".join(sorted(inbox.sources)) or "none"
        raise CommandError(
            f"no source {args.source!r} in {settings.config} (its sources: {known}); "
            "INBOX_CONFIG names the file `serve` reads",
            Exit.USAGE,
        )
    require_secrets(settings, inbox, source.name)
    wanted = read_file(args.file)
    wanted = Wanted(wanted.payload, wanted.raw, args.id, args.event_type)
    try:
        delivery = build_delivery(source, wanted)
    except CannotBuild as exc:
        raise CommandError(str(exc), Exit.USAGE) from None
    url = f"{base_url(settings, args.url)}/webhooks/{source.name}"
    try:
        response = httpx.post(
            url,
            content=delivery.body,
            headers={"user-agent": "webhook-inbox send", **delivery.headers},
            params=delivery.query,
            timeout=args.timeout,
        )
    except httpx.HTTPError as exc:
        raise CommandError(
            f"no answer from {url}: {exc or type(exc).__name__} (is `webhook-inbox serve` "
            "running? --url names another address)",
            Exit.UNAVAILABLE,
        ) from None
    print(response.text)
    if not response.is_success or refused_by_answer(response):
        print(f"webhook-inbox send: {source.name} answered {response.status_code}", file=sys.stderr)
        return Exit.FAILED
    return Exit.OK


def refused_by_answer(response: httpx.Response) -> bool:
    """A 2xx that still refuses: Dapr's `DROP` or `RETRY` answers."""
    try:
        answer: Any = response.json()
    except ValueError:
        return False
    return isinstance(answer, dict) and answer.get("status") in ("DROP", "RETRY")
