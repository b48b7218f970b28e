"""`messages`, `dead-letters` and `stats`: the admin API's reads and actions, from the shell.

Same store functions, same filters and validation, same JSON documents (`--json`) as the admin
API; what differs is the cursor, which here is the readable position `<received_at>/<id>` of
the last row shown (the shell already has the database, so there is nothing to sign).
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import socket
import textwrap
from collections.abc import Coroutine
from dataclasses import asdict
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ValidationError
from sqlalchemy.ext.asyncio import AsyncEngine

from service.api.admin.messages import detail_from_row, to_filter
from service.api.admin.models import (
    BulkRetryRequest,
    BulkRetryResult,
    DeadLetterGroup,
    DeadLetterGroups,
    DeadLetterQuery,
    MessageQuery,
    MessageSummary,
    RetryResult,
)
from service.api.admin.operations import collect_stats
from service.commands.database import operator_engine, operator_settings
from service.commands.outcome import CommandError, Exit
from service.commands.output import print_json
from service.commands.views import describe_detail, groups_table, stats_table, summary_table
from service.core.schema import Status
from service.store import admin as store
from service.store.admin import MessageFilter, Position

DATABASE_HELP = """
The database is DATABASE_URL's, or else the embedded PostgreSQL under INBOX_DATA_DIR (default
.inbox) that `serve` runs: run the command where `serve` runs. One that is stopped is started
for the command; a missing one is not created.
Exit status: 0 done, 1 not found or not allowed, 2 usage error, 3 database unavailable.
"""
FILTERS_HELP = (
    """
Filters combine with AND, as in GET /admin/messages. Times are ISO 8601 (no offset: UTC)."""
    + DATABASE_HELP
)


def add_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    messages = subcommand(
        commands,
        "messages",
        help="list, show, retry, replay or discard messages (the admin API from the shell)",
        description="The inbox's messages, through the same store functions as the admin API.",
        epilog=FILTERS_HELP,
    )
    actions = messages.add_subparsers(dest="action", required=True, metavar="ACTION")

    listing = subcommand(
        actions,
        "list",
        help="messages, newest first, filtered and paged",
        description="List messages, newest first, filtered and paged (GET /admin/messages).",
        epilog=FILTERS_HELP,
    )
    add_filters(listing, statuses=True)
    add_paging(listing)
    listing.set_defaults(run=lambda args: run(list_messages(args, "messages")))

    show = subcommand(
        actions,
        "show",
        help="one message: headers, body, attempts",
        description="Show one message with its headers, body and attempt history "
        "(GET /admin/messages/{id}).",
    )
    show.add_argument("id", type=inbox_id, help="the inbox row id (the ID column of `list`)")
    add_json(show)
    show.set_defaults(run=lambda args: run(show_message(args)))

    for name, help_text, description in (
        (
            "retry",
            "give a retrying, dead or discarded message a fresh attempt budget",
            "Move a retrying, dead or discarded message back to pending with a fresh attempt "
            "budget (POST /admin/messages/{id}/retry). A processed message needs `replay`.",
        ),
        (
            "replay",
            "run a message's handlers again, even a processed one",
            "Retry a message even if it was processed: its handlers run again "
            '(POST /admin/messages/{id}/retry with {"force": true}).',
        ),
        (
            "discard",
            "set a message aside; redeliveries stay duplicates",
            "Set a pending, retrying or dead message aside as discarded; its dedup row stays "
            "(POST /admin/messages/{id}/discard).",
        ),
    ):
        action = subcommand(
            actions,
            name,
            help=help_text,
            description=description,
        )
        action.add_argument("id", type=inbox_id, help="the inbox row id")
        add_json(action)
        action.set_defaults(run=lambda args, name=name: run(change_message(args, name)))

    bulk = subcommand(
        actions,
        "bulk-retry",
        help="retry every message matching the filters; --dry-run counts them",
        description="Retry every message matching the filters, in batches "
        "(POST /admin/messages/retry): the retrying and dead ones unless --status names "
        "others; discarded ones only when named, processed ones only when named and --force.",
        epilog=FILTERS_HELP,
    )
    add_filters(bulk, statuses=True)
    bulk.add_argument(
        "--force", action="store_true", help="replay the processed messages --status names"
    )
    bulk.add_argument("--dry-run", action="store_true", help="only count the matching messages")
    add_json(bulk)
    bulk.set_defaults(run=lambda args: run(bulk_retry(args)))

    dead = subcommand(
        commands,
        "dead-letters",
        help="the dead messages, newest first",
        description="List dead messages (attempts exhausted or failed permanently), newest "
        "first (GET /admin/dead-letters). Retry one with `messages retry ID`, or all that "
        "match with `messages bulk-retry`.",
        epilog=FILTERS_HELP,
    )
    add_filters(dead, statuses=False)
    add_paging(dead)
    dead.add_argument(
        "--groups",
        action="store_true",
        help="count them by the error type of their last failed attempt instead "
        "(GET /admin/dead-letters/groups; no paging)",
    )
    dead.set_defaults(run=lambda args: run(list_dead_letters(args)))

    stats = subcommand(
        commands,
        "stats",
        help="counts by source and status, backlog age, last hour's attempts",
        description="Count messages by source and status; show the backlog's age and the last "
        "hour's attempts (GET /admin/stats).",
    )
    add_json(stats)
    stats.set_defaults(run=lambda args: run(show_stats(args)))


def subcommand(
    parent: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    *,
    help: str,
    description: str,
    epilog: str = DATABASE_HELP,
) -> argparse.ArgumentParser:
    """A command whose help ends with where its database is and its exit statuses."""
    return parent.add_parser(
        name,
        help=help,
        description=textwrap.fill(description, width=92),
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def add_json(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json", action="store_true", help="print the admin API's JSON document instead"
    )


def add_filters(parser: argparse.ArgumentParser, *, statuses: bool) -> None:
    group = parser.add_argument_group("filters")
    group.add_argument("--source", help="only this source's messages")
    if statuses:
        group.add_argument(
            "--status",
            action="append",
            default=[],
            choices=[s.value for s in Status],
            metavar="STATUS",
            help="only messages in this status (pending, processing, processed, retrying, dead, "
            "discarded); repeat for several",
        )
    group.add_argument(
        "--event-type", help="only this event type, matched as the admin API matches it"
    )
    group.add_argument("--message-id", help="only the message with this dedup key")
    group.add_argument(
        "--received-after",
        "--since",
        metavar="TIME",
        help="first received at or after TIME (ISO 8601)",
    )
    group.add_argument(
        "--received-before", "--until", metavar="TIME", help="first received before TIME"
    )
    group.add_argument(
        "--error-type", help="whose latest failed attempt raised this exception type"
    )


def add_paging(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--limit", type=int, default=50, help="rows per page, 1 to 500 (default 50)"
    )
    parser.add_argument(
        "--cursor", help="continue after this position (the `next` line of the previous page)"
    )
    add_json(parser)


def inbox_id(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not an inbox id (a number)") from None
    if not 1 <= number <= 2**63 - 1:
        raise argparse.ArgumentTypeError(f"{value} is not an inbox id (1 or more)")
    return number


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
    settings = operator_settings()
    async with operator_engine(settings) as engine:
        groups = await store.dead_letter_groups(engine, filters)
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
    settings = operator_settings()
    async with operator_engine(settings) as engine:
        rows, last = await store.list_messages(engine, filters, limit, after)
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
    settings = operator_settings()
    async with operator_engine(settings) as engine:
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


async def apply_change(
    engine: AsyncEngine, name: str, message_id: int, who: str
) -> tuple[dict[str, Any], str]:
    """Retry, replay or discard one message; the row after it and the action recorded."""
    if name == "discard":
        row, changed = await store.discard_message(engine, message_id, who)
        return row, store.ADMIN_DISCARD if changed else "none"
    return await store.retry_message(engine, message_id, who, force=name == "replay")


async def change_message(args: argparse.Namespace, name: str) -> Exit:
    settings = operator_settings()
    async with operator_engine(settings) as engine:
        row, action = await acting(apply_change(engine, name, args.id, actor()))
    result = RetryResult.model_validate({**row, "attempt_count": row["attempts"], "action": action})
    if args.json:
        print_json(result)
    elif action == "none":
        print(f"message {result.id} was already discarded; nothing changed")
    else:
        print(
            f"message {result.id} ({result.source} {result.message_id}): {action}, "
            f"now {result.status.value}"
        )
    return Exit.OK


async def show_stats(args: argparse.Namespace) -> Exit:
    settings = operator_settings()
    async with operator_engine(settings) as engine:
        stats = await collect_stats(engine)
    if args.json:
        print_json(stats)
        return Exit.OK
    print(stats_table(stats))
    return Exit.OK


async def bulk_retry(args: argparse.Namespace) -> Exit:
    request = validated(
        BulkRetryRequest,
        {
            **filter_values(args),
            "status": args.status,
            "force": args.force,
            "dry_run": args.dry_run,
        },
    )
    settings = operator_settings()
    async with operator_engine(settings) as engine:
        result = await store.bulk_retry(
            engine,
            to_filter(request, list(request.status)),
            actor(),
            force=request.force,
            dry_run=request.dry_run,
        )
    if args.json:
        print_json(BulkRetryResult(matched=result.matched, retried=result.retried))
    elif request.dry_run:
        print(f"{result.matched} messages match; run again without --dry-run to retry them")
    else:
        print(f"{result.matched} messages matched, {result.retried} retried")
    return Exit.OK
