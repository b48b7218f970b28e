"""`messages`, `issues`, `dead-letters`, `rejected`, `stats` and `outbox`: their arguments and
help.

They run in `service/commands/admin.py`, imported only when one runs, so that `webhook-inbox
--help` needs neither the admin API nor SQLAlchemy.
"""

from __future__ import annotations

import argparse
import importlib
import textwrap
from typing import Any

from service.commands.outcome import Exit
from service.commands.parsers import add_status_filter, command_parser
from service.core.status import IssueStatus, Status

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
    listing.set_defaults(run=run("list_messages", "messages"))

    show = subcommand(
        actions,
        "show",
        help="one message: headers, body, attempts",
        description="Show one message with its headers, body and attempt history "
        "(GET /admin/messages/{id}).",
    )
    show.add_argument("id", type=inbox_id, help="the inbox row id (the ID column of `list`)")
    add_json(show)
    show.set_defaults(run=run("show_message"))

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
            "Set a message that is not processed aside as discarded, at once (a processing one "
            "too, unless a live attempt holds it); it is not run again and its dedup row stays "
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
        action.add_argument(
            "--destination",
            metavar="NAME",
            help=f"{name} only this named destination of the message, leaving its others as "
            "they are (POST /admin/messages/{id}/destinations/{name}/"
            f"{'discard' if name == 'discard' else 'retry'})",
        )
        add_json(action)
        action.set_defaults(run=run("change_message", name))

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
    bulk.set_defaults(run=run("bulk_retry"))

    replay_to = subcommand(
        actions,
        "replay-to",
        help="run one named destination for a source's messages; --dry-run counts them",
        description="Run one named destination for the source's messages matching the "
        "filters, in batches, leaving their other destinations as they are "
        "(POST /admin/sources/{source}/destinations/{name}/replay): the older messages a "
        "destination added later never received. Every status but processing unless --status "
        "names some; a message the destination's own filter does not pass is recorded as "
        "skipped by it.",
        epilog=FILTERS_HELP,
    )
    replay_to.add_argument("destination", help="the destination's name")
    replay_to.add_argument("--source", required=True, help="the source the destination is of")
    add_status_filter(
        replay_to,
        [s.value for s in Status if s != Status.PROCESSING],
        "STATUS",
        "only messages in this status; repeat for several",
    )
    replay_to.add_argument("--event-type", help="only this event type (`*` and `?` wildcards)")
    replay_to.add_argument(
        "--received-after", "--since", metavar="TIME", help="first received at or after TIME"
    )
    replay_to.add_argument(
        "--received-before", "--until", metavar="TIME", help="first received before TIME"
    )
    replay_to.add_argument(
        "--dry-run", action="store_true", help="only count the matching messages"
    )
    add_json(replay_to)
    replay_to.set_defaults(run=run("replay_to_destination"))

    destinations = subcommand(
        commands,
        "destinations",
        help="counts by named destination and status",
        description="Count (message, destination) pairs by status for every named destination "
        "(GET /admin/destinations). Reads the sources file (INBOX_CONFIG) for the configured "
        "ones.",
    )
    add_json(destinations)
    destinations.set_defaults(run=run("show_destinations"))

    outbox = subcommand(
        commands,
        "outbox",
        help="the outbox's endpoints: outgoing messages by status, breaker, pause",
        description="List the outbox's endpoints ([endpoints.NAME] in the sources file, "
        "INBOX_CONFIG) with their outgoing messages by status, the oldest unsent one's age, "
        "and whether a breaker or a pause holds them (GET /admin/outbox). The messages "
        "themselves: `messages list --source outbox:NAME`; retry them with `messages retry` "
        "or `messages bulk-retry --source outbox:NAME`.",
    )
    add_json(outbox)
    outbox.set_defaults(run=run("show_outbox"))

    pause = subcommand(
        commands,
        "pause",
        help="pause a source's processing (ingest keeps accepting)",
        description="Pause a source's processing (POST /admin/sources/{source}/pause): no "
        "worker claims its messages until it is resumed, across restarts; its deliveries are "
        "still accepted and deduplicated, and wait as pending with no attempt spent. A batch "
        "already claimed finishes. Reads the sources file (INBOX_CONFIG).",
    )
    pause.add_argument("source", help="a configured source, or outbox:ENDPOINT")
    pause.add_argument("--reason", required=True, help="why, for whoever finds it paused")
    add_operator(pause)
    add_json(pause)
    pause.set_defaults(run=run("pause_command"))

    resume = subcommand(
        commands,
        "resume",
        help="resume a paused source's processing",
        description="Resume a paused source (POST /admin/sources/{source}/resume): the workers "
        "claim its messages again.",
    )
    resume.add_argument("source", help="a configured source, or outbox:ENDPOINT")
    add_json(resume)
    resume.set_defaults(run=run("resume_command"))

    add_issue_commands(commands)

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
    dead.set_defaults(run=run("list_dead_letters"))

    rejected = subcommand(
        commands,
        "rejected",
        help="deliveries refused with a 4xx in the last day, newest first",
        description="List the deliveries ingest refused with a 4xx (bad signature or token, "
        "stale timestamp, no message id, too large, an unreadable body...) in the last day, "
        "newest first, with why and their headers redacted (GET /admin/rejected): a "
        "misconfigured sender found without reading logs. Bodies are never kept.",
    )
    rejected.add_argument("source", nargs="?", help="only this source's")
    rejected.add_argument(
        "--limit", type=int, default=50, help="rows per page, 1 to 500 (default 50)"
    )
    rejected.add_argument(
        "--before", type=inbox_id, metavar="ID", help="older than this id (the `next` line)"
    )
    rejected.add_argument("--headers", action="store_true", help="show each one's headers too")
    add_json(rejected)
    rejected.set_defaults(run=run("list_rejected"))

    stats = subcommand(
        commands,
        "stats",
        help="counts by source and status, backlog age, last hour's attempts",
        description="Count messages by source and status; show the backlog's age and the last "
        "hour's attempts (GET /admin/stats).",
    )
    add_json(stats)
    stats.set_defaults(run=run("show_stats"))


def add_issue_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    issues = subcommand(
        commands,
        "issues",
        help="failures grouped by cause: list, show, acknowledge, resolve, ignore, retry",
        description="Failures grouped by cause, one issue per fingerprint, through the same "
        "store functions as the admin API (GET /admin/issues).",
    )
    actions = issues.add_subparsers(dest="action", required=True, metavar="ACTION")

    listing = subcommand(
        actions,
        "list",
        help="the issues, most recently failing first",
        description="List the issues, most recently failing first, with their messages now "
        "retrying and dead (GET /admin/issues).",
    )
    listing.add_argument("--source", help="only this source's issues")
    add_status_filter(
        listing,
        [s.value for s in IssueStatus],
        "STATUS",
        "only issues in this status (open, acknowledged, resolved, ignored); repeat for several",
    )
    listing.add_argument(
        "--limit", type=int, default=50, help="at most this many, 1 to 500 (default 50)"
    )
    add_json(listing)
    listing.set_defaults(run=run("list_issues"))

    show = subcommand(
        actions,
        "show",
        help="one issue and its messages, newest first",
        description="Show one issue, its latest error and traceback, and its messages newest "
        "first (GET /admin/issues/{fingerprint}).",
    )
    show.add_argument("fingerprint", help="the issue's fingerprint (the list's first column)")
    show.add_argument(
        "--limit", type=int, default=50, help="at most this many messages, 1 to 500 (default 50)"
    )
    add_json(show)
    show.set_defaults(run=run("show_issue"))

    for name, help_text in (
        ("acknowledge", "someone is on it: it stays acknowledged when it fails again"),
        ("resolve", "its cause is fixed: it opens again when it fails again"),
        ("ignore", "its failures are expected: it stays ignored when it fails again"),
        ("reopen", "an acknowledged, resolved or ignored issue is open again"),
    ):
        decision = subcommand(
            actions,
            name,
            help=help_text,
            description=f"{name.capitalize()} an issue: {help_text} "
            f"(POST /admin/issues/{{fingerprint}}/{name}). Records --operator and --note with it.",
        )
        decision.add_argument("fingerprint", help="the issue's fingerprint")
        decision.add_argument(
            "--note",
            required=name == "acknowledge",
            help="why, for whoever finds it; without one, the issue keeps its note",
        )
        add_operator(decision)
        add_json(decision)
        decision.set_defaults(run=run("decide_issue", name))

    retry = subcommand(
        actions,
        "retry",
        help="resolve an issue and retry its dead messages; --dry-run counts them",
        description="Resolve an issue and retry its dead messages (those whose latest failed "
        "attempt has its fingerprint) with a fresh attempt budget, in batches "
        "(POST /admin/issues/{fingerprint}/retry). A message failing again of the same cause "
        "opens it again.",
    )
    retry.add_argument("fingerprint", help="the issue's fingerprint")
    retry.add_argument(
        "--dry-run", action="store_true", help="only count its dead messages; change nothing"
    )
    add_operator(retry)
    add_json(retry)
    retry.set_defaults(run=run("retry_issue"))


def add_operator(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--operator", help="your name, as others know you (default: the shell's user@host)"
    )


def subcommand(
    parent: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    *,
    help: str,
    description: str,
    epilog: str = DATABASE_HELP,
) -> argparse.ArgumentParser:
    """A command whose help ends with where its database is and its exit statuses."""
    return command_parser(
        parent, name, help=help, description=textwrap.fill(description, width=92), epilog=epilog
    )


def add_json(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json", action="store_true", help="print the admin API's JSON document instead"
    )


def add_filters(parser: argparse.ArgumentParser, *, statuses: bool) -> None:
    group = parser.add_argument_group("filters")
    group.add_argument("--source", help="only this source's messages")
    if statuses:
        add_status_filter(
            group,
            [s.value for s in Status],
            "STATUS",
            "only messages in this status (pending, processing, processed, retrying, dead, "
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
    group.add_argument("--ordering-key", metavar="KEY", help="only messages with this ordering key")
    group.add_argument(
        "--held",
        action="store_true",
        default=None,
        help="only messages held behind an earlier unfinished message of their ordering key",
    )
    add_search(parser)


def add_search(parser: argparse.ArgumentParser) -> None:
    """The search filters: what a message holds (docs/search.md)."""
    group = parser.add_argument_group("search (what a message holds; docs/search.md)")
    group.add_argument(
        "-q",
        "--search",
        metavar="TEXT",
        help="a value anywhere in the JSON payload, or the dedup key (ch_3QH…, cus_9)",
    )
    group.add_argument("--id-prefix", metavar="PREFIX", help="dedup keys starting with PREFIX")
    group.add_argument(
        "--where",
        metavar="COND",
        action="append",
        default=[],
        help="PATH=VALUE, PATH!=VALUE, 'PATH in A,B' or 'PATH exists' on the payload "
        "(data.object.customer=cus_9); repeat for several",
    )
    group.add_argument(
        "--contains", metavar="JSON", help="the payload contains this JSON document (as @>)"
    )
    group.add_argument(
        "--header",
        metavar="'NAME: VALUE'",
        action="append",
        default=[],
        help="delivered with this header value; repeat for several",
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


def run(command: str, *bound: Any) -> Any:
    """The `run` of a command: `service.commands.admin`'s coroutine `command`, called with the
    parsed arguments and `bound`, on an event loop of its own."""

    def run_command(args: argparse.Namespace) -> Exit:
        admin = importlib.import_module("service.commands.admin")
        status: Exit = admin.run(getattr(admin, command)(args, *bound))
        return status

    return run_command
