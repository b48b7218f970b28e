"""`messages`, `issues`, `dead-letters` and `stats` at work: the admin API's reads and
actions, from the shell (their arguments are in `service/commands/inbox.py`).

Same store functions, same filters and validation, same JSON documents (`--json`) as the admin
API; what differs is the cursor, which here is the readable position `<received_at>/<id>` of
the last row shown (the shell already has the database, so there is nothing to sign).
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import re
import socket
from collections.abc import Coroutine
from dataclasses import asdict
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ValidationError
from sqlalchemy.ext.asyncio import AsyncEngine

from service.api.admin.destinations import collect_destination_stats, configured_of, replay_filter
from service.api.admin.issues import DECISIONS, issue_detail
from service.api.admin.messages import detail_from_row, to_filter
from service.api.admin.models import (
    FINGERPRINT_PATTERN,
    BulkRetryRequest,
    BulkRetryResult,
    DeadLetterGroup,
    DeadLetterGroups,
    DeadLetterQuery,
    DestinationReplayRequest,
    IssueAction,
    IssueDetailQuery,
    IssueList,
    IssueQuery,
    IssueRetryRequest,
    IssueSummary,
    MessageQuery,
    MessageSummary,
    PauseRequest,
    PauseResult,
    RetryResult,
    SourcePause,
)
from service.api.admin.operations import collect_stats
from service.api.admin.outbox import collect_endpoints
from service.api.admin.rejections import RejectedQuery, rejected_page
from service.commands.database import operator_engine, operator_settings
from service.commands.outcome import CommandError, Exit
from service.commands.output import print_json
from service.commands.send import load_sources
from service.commands.views import (
    describe_detail,
    describe_issue,
    destinations_table,
    endpoints_table,
    groups_table,
    issues_table,
    rejected_table,
    stats_table,
    summary_table,
)
from service.core.schema import Status
from service.core.settings import Settings
from service.store import admin as store
from service.store import destinations, flow, issues
from service.store.admin import MessageFilter, Position
from service.store.search import SearchError, SearchTooBroad


def run(command: Coroutine[Any, Any, Exit]) -> Exit:
    return asyncio.run(command)


def validated(model: type[BaseModel], values: dict[str, Any]) -> Any:
    """`values` checked by the admin API's own query model: one line and exit 2 if refused."""
    try:
        return model.model_validate({k: v for k, v in values.items() if v is not None})
    except ValidationError as exc:
        first = exc.errors()[0]
        option = "--" + str(first["loc"][0]).replace("_", "-") if first["loc"] else "value"
        raise CommandError(f"{option}: {first['msg']}", Exit.USAGE) from None


def encode_position(position: Position) -> str:
    return f"{position.received_at.isoformat()}/{position.id}"


def decode_position(cursor: str) -> Position:
    when, slash, number = cursor.rpartition("/")
    try:
        if not slash:
            raise ValueError
        return Position(datetime.fromisoformat(when), int(number))
    except ValueError:
        raise CommandError(
            f"--cursor {cursor!r} is not a position: pass the `next` value a page printed",
            Exit.USAGE,
        ) from None


def filter_values(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "source": args.source,
        "event_type": args.event_type,
        "message_id": args.message_id,
        "received_after": args.received_after,
        "received_before": args.received_before,
        "error_type": args.error_type,
        "ordering_key": args.ordering_key,
        "held": args.held,
        "q": args.search,
        "id_prefix": args.id_prefix,
        "where": args.where,
        "contains": args.contains,
        "header": args.header,
    }


def query_filters(args: argparse.Namespace, listing: str) -> tuple[MessageFilter, int]:
    values = {**filter_values(args), "limit": args.limit}
    if listing == "messages":
        query = validated(MessageQuery, {**values, "status": args.status})
        return to_filter(query, list(query.status)), query.limit
    query = validated(DeadLetterQuery, values)
    return to_filter(query, [Status.DEAD]), query.limit


async def list_dead_letters(args: argparse.Namespace) -> Exit:
    if not args.groups:
        return await list_messages(args, "dead-letters")
    if args.cursor:
        raise CommandError("--groups has no pages: drop --cursor", Exit.USAGE)
    filters, _ = query_filters(args, "dead-letters")
    async with operator_engine() as engine:
        groups = await acting(store.dead_letter_groups(engine, filters))
    document = DeadLetterGroups(groups=[DeadLetterGroup.model_validate(asdict(g)) for g in groups])
    if args.json:
        print_json(document)
    elif not groups:
        print("no dead letters match")
    else:
        print(groups_table(document))
    return Exit.OK


async def list_messages(args: argparse.Namespace, listing: str) -> Exit:
    filters, limit = query_filters(args, listing)
    after = decode_position(args.cursor) if args.cursor else None
    async with operator_engine() as engine:
        rows, last = await acting(store.list_messages(engine, filters, limit, after))
    items = [MessageSummary.from_row(r) for r in rows]
    next_cursor = None if last is None else encode_position(last)
    if args.json:
        print_json(
            {"items": [i.model_dump(mode="json") for i in items], "next_cursor": next_cursor}
        )
        return Exit.OK
    print(summary_table(items))
    if next_cursor is not None:
        print(f"next: --cursor '{next_cursor}'")
    return Exit.OK


async def show_message(args: argparse.Namespace) -> Exit:
    async with operator_engine() as engine:
        row = await acting(store.get_message(engine, args.id))
    detail = detail_from_row(row)
    if args.json:
        print_json(detail)
    else:
        print(describe_detail(detail))
    return Exit.OK


def actor() -> str:
    """Who the history records for an action taken here: the shell's user and host."""
    try:
        user = getpass.getuser()
    except (OSError, KeyError):
        user = "unknown"
    return f"cli:{user}@{socket.gethostname()}"


async def acting(action: Coroutine[Any, Any, Any]) -> Any:
    """The store's refusals as exit status 1 with the admin API's wording."""
    try:
        return await action
    except store.MessageNotFound as exc:
        raise CommandError(f"no message with id {exc.args[0]}", Exit.FAILED) from None
    except store.InvalidTransition as exc:
        detail = exc.detail.replace('send {"force": true} to do that', "use `replay` for that")
        raise CommandError(detail, Exit.FAILED) from None
    except destinations.UnknownDestination as exc:
        raise CommandError(exc.detail, Exit.FAILED) from None
    except (SearchError, SearchTooBroad) as exc:
        raise CommandError(str(exc), Exit.FAILED) from None


async def apply_change(
    engine: AsyncEngine,
    name: str,
    message_id: int,
    who: str,
    destination: str | None = None,
    known: dict[str, list[str]] | None = None,
) -> tuple[dict[str, Any], str]:
    """Retry, replay or discard one message, or one of its destinations (`known`: each
    source's); the row after it and the action recorded."""
    if destination is not None:
        known = known or {}
        if name == "discard":
            row, changed = await destinations.discard_destination(
                engine, message_id, destination, who, known
            )
            return row, store.ADMIN_DISCARD if changed else "none"
        return await destinations.retry_destination(
            engine, message_id, destination, who, name == "replay", known
        )
    if name == "discard":
        row, changed = await store.discard_message(engine, message_id, who)
        return row, store.ADMIN_DISCARD if changed else "none"
    return await store.retry_message(engine, message_id, who, force=name == "replay")


async def change_message(args: argparse.Namespace, name: str) -> Exit:
    settings = operator_settings()
    known = configured_of(load_sources(settings)) if args.destination else None
    async with operator_engine(settings) as engine:
        row, action = await acting(
            apply_change(engine, name, args.id, actor(), args.destination, known)
        )
    result = RetryResult.model_validate({**row, "attempt_count": row["attempts"], "action": action})
    if args.json:
        print_json(result)
    elif action == "none":
        what = "" if args.destination is None else f"'s destination {args.destination}"
        print(f"message {result.id}{what} was already discarded; nothing changed")
    else:
        what = "" if args.destination is None else f" destination {args.destination}"
        now = "now" if args.destination is None else "message now"
        print(
            f"message {result.id} ({result.source} {result.message_id}){what}: {action}, "
            f"{now} {result.status.value}"
        )
    return Exit.OK


async def show_outbox(args: argparse.Namespace) -> Exit:
    settings = operator_settings()
    inbox = load_sources(settings)
    async with operator_engine(settings) as engine:
        listed = await collect_endpoints(engine, inbox)
    if args.json:
        print_json(listed)
    else:
        print(endpoints_table(listed))
    return Exit.OK


async def show_stats(args: argparse.Namespace) -> Exit:
    async with operator_engine() as engine:
        stats = await collect_stats(engine)
    if args.json:
        print_json(stats)
        return Exit.OK
    print(stats_table(stats))
    return Exit.OK


async def bulk_retry(args: argparse.Namespace) -> Exit:
    request = bulk_request(BulkRetryRequest, args, **filter_values(args), force=args.force)
    async with operator_engine() as engine:
        result = await acting(
            store.bulk_retry(
                engine,
                to_filter(request, list(request.status)),
                actor(),
                force=request.force,
                dry_run=request.dry_run,
            )
        )
    print_bulk(args, result, again="retry them", done="retried")
    return Exit.OK


def bulk_request(model: type[BaseModel], args: argparse.Namespace, **values: Any) -> Any:
    """The admin API's request of a bulk action: `values`, with the command's `--status` and
    `--dry-run`, checked by `model`."""
    return validated(model, {**values, "status": args.status, "dry_run": args.dry_run})


def print_bulk(
    args: argparse.Namespace, result: store.BulkRetryResult, *, again: str, done: str
) -> None:
    """A bulk action's answer: the admin API's document, or how many messages matched and
    (after a dry run) what running `again` would do, or how many were `done`."""
    if args.json:
        print_json(BulkRetryResult(matched=result.matched, retried=result.retried))
    elif args.dry_run:
        print(f"{result.matched} messages match; run again without --dry-run to {again}")
    else:
        print(f"{result.matched} messages matched, {result.retried} {done}")


async def replay_to_destination(args: argparse.Namespace) -> Exit:
    request = bulk_request(
        DestinationReplayRequest,
        args,
        event_type=args.event_type,
        received_after=args.received_after,
        received_before=args.received_before,
    )
    settings = operator_settings()
    if args.destination not in configured_of(load_sources(settings)).get(args.source, []):
        raise CommandError(
            f"source {args.source} has no destination {args.destination}", Exit.FAILED
        )
    async with operator_engine(settings) as engine:
        result = await destinations.replay_to_destination(
            engine,
            replay_filter(args.source, request),
            args.destination,
            actor(),
            dry_run=request.dry_run,
        )
    to = f"to {args.destination}"
    print_bulk(args, result, again=f"replay them {to}", done=f"replayed {to}")
    return Exit.OK


async def show_destinations(args: argparse.Namespace) -> Exit:
    settings = operator_settings()
    known = configured_of(load_sources(settings))
    async with operator_engine(settings) as engine:
        listed = await collect_destination_stats(engine, known)
    if args.json:
        print_json(listed)
    else:
        print(destinations_table(listed))
    return Exit.OK


def configured_source(settings: Settings, source: str) -> None:
    sources = load_sources(settings).row_sources
    if source not in sources:
        names = ", ".join(sorted(sources)) or "none"
        raise CommandError(f"no source {source} is configured (configured: {names})", Exit.FAILED)


def operator_of(args: argparse.Namespace) -> str:
    """The name an action is taken under: `--operator`, or the shell's user@host."""
    return str(args.operator or actor().removeprefix("cli:"))


async def pause_command(args: argparse.Namespace) -> Exit:
    who = actor()
    request = validated(PauseRequest, {"operator": operator_of(args), "reason": args.reason})
    settings = operator_settings()
    configured_source(settings, args.source)
    async with operator_engine(settings) as engine:
        row = await flow.pause_source(engine, args.source, request.operator, request.reason, who)
    result = PauseResult(source=args.source, paused=SourcePause.model_validate(row), changed=True)
    if args.json:
        print_json(result)
    else:
        print(f"{args.source} paused by {request.operator}: {request.reason}")
    return Exit.OK


async def resume_command(args: argparse.Namespace) -> Exit:
    settings = operator_settings()
    configured_source(settings, args.source)
    async with operator_engine(settings) as engine:
        row = await flow.resume_source(engine, args.source)
    if args.json:
        print_json(PauseResult(source=args.source, paused=None, changed=row is not None))
    elif row is None:
        print(f"{args.source} was not paused; nothing changed")
    else:
        print(f"{args.source} resumed (paused by {row['operator']} since {row['paused_at']})")
    return Exit.OK


async def list_rejected(args: argparse.Namespace) -> Exit:
    query = validated(
        RejectedQuery, {"source": args.source, "limit": args.limit, "before": args.before}
    )
    async with operator_engine() as engine:
        page = await rejected_page(engine, query)
    if args.json:
        print_json(page)
        return Exit.OK
    print(rejected_table(page.items, headers=args.headers))
    if page.next_before is not None:
        print(f"next: --before {page.next_before}")
    return Exit.OK


async def known_issue(action: Coroutine[Any, Any, Any]) -> Any:
    """An unknown fingerprint as exit status 1 with the admin API's wording."""
    try:
        return await action
    except issues.IssueNotFound as exc:
        raise CommandError(f"no issue with fingerprint {exc.args[0]}", Exit.FAILED) from None


async def list_issues(args: argparse.Namespace) -> Exit:
    query = validated(
        IssueQuery, {"source": args.source, "status": args.status, "limit": args.limit}
    )
    async with operator_engine() as engine:
        rows = await issues.list_issues(engine, query.source, query.status, query.limit)
    listed = IssueList(items=[IssueSummary.model_validate(row) for row in rows])
    if args.json:
        print_json(listed)
    else:
        print(issues_table(listed.items))
    return Exit.OK


async def show_issue(args: argparse.Namespace) -> Exit:
    fingerprint = validated_fingerprint(args.fingerprint)
    query = validated(IssueDetailQuery, {"limit": args.limit})
    async with operator_engine() as engine:
        row = await known_issue(issues.get_issue(engine, fingerprint, query.limit))
    detail = issue_detail(row)
    if args.json:
        print_json(detail)
    else:
        print(describe_issue(detail))
    return Exit.OK


def validated_fingerprint(value: str) -> str:
    if not re.fullmatch(FINGERPRINT_PATTERN, value):
        raise CommandError(
            f"{value!r} is not a fingerprint (16 lowercase hex, as `issues list` shows)",
            Exit.USAGE,
        )
    return value


async def decide_issue(args: argparse.Namespace, name: str) -> Exit:
    fingerprint = validated_fingerprint(args.fingerprint)
    request = validated(IssueAction, {"operator": operator_of(args), "note": args.note})
    async with operator_engine() as engine:
        row = await known_issue(
            issues.set_issue_status(
                engine, fingerprint, DECISIONS[name], request.operator, request.note
            )
        )
    result = IssueSummary.model_validate(row)
    if args.json:
        print_json(result)
    else:
        print(f"issue {fingerprint} ({result.source} {result.error_type}): {result.status.value}")
    return Exit.OK


async def retry_issue(args: argparse.Namespace) -> Exit:
    fingerprint = validated_fingerprint(args.fingerprint)
    request = validated(IssueRetryRequest, {"operator": operator_of(args), "dry_run": args.dry_run})
    async with operator_engine() as engine:
        result = await known_issue(
            issues.resolve_and_retry(
                engine, fingerprint, request.operator, actor(), dry_run=request.dry_run
            )
        )
    if args.json:
        print_json(BulkRetryResult(matched=result.matched, retried=result.retried))
    elif args.dry_run:
        print(
            f"{result.matched} dead messages of issue {fingerprint}; run again without "
            "--dry-run to resolve it and retry them"
        )
    else:
        print(
            f"issue {fingerprint} resolved; {result.matched} dead messages matched, "
            f"{result.retried} retried"
        )
    return Exit.OK
