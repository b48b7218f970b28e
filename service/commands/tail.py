"""`webhook-inbox tail`: each delivery accepted, each duplicate and each outcome, as it happens,
one line each, until Ctrl-C (the stream of GET /admin/tail, read from the database directly)."""

from __future__ import annotations

import argparse
import contextlib
import textwrap
from typing import TYPE_CHECKING

from service.commands.outcome import Exit
from service.commands.parsers import add_status_filter, command_parser
from service.core.status import TailKind

if TYPE_CHECKING:
    from service.store.tail import TailEvent

DESCRIPTION = """
Follow the inbox as it happens, like `stripe listen`: one line when a delivery is accepted,
when a duplicate of it arrives, and when an attempt ends (processed; failed, with its error;
dead), in any `serve` or `worker` process on the database, until Ctrl-C. It starts now: what
happened before is in `messages list`. With --json, one JSON document a line, as the data of
GET /admin/tail's events.
"""

EXAMPLE = """
  webhook-inbox tail payments --status failed --status dead
  2026-12-09 10:00:01  payments  #42  evt_1  charge.succeeded  failed (attempt 1)  \
ConnectionError: billing down
"""

WHERE = """
The database is DATABASE_URL's, or else the embedded PostgreSQL under INBOX_DATA_DIR (default
.inbox) that `serve` runs: run the command where `serve` runs.
Exit status: 0 stopped with Ctrl-C, 2 usage error, 3 database unavailable.
"""


def add_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    command = command_parser(
        commands,
        "tail",
        help="follow deliveries, duplicates and outcomes as they happen, until Ctrl-C",
        description=textwrap.fill(DESCRIPTION.strip(), width=92),
        epilog="Example:" + EXAMPLE + WHERE,
    )
    command.add_argument("source", nargs="*", help="only these sources' messages (default: all)")
    add_status_filter(
        command,
        [k.value for k in TailKind],
        "KIND",
        "only this kind of event: accepted, duplicate, processed, failed, dead; repeat for "
        "several (default: all)",
    )
    command.add_argument("--event-type", help="only this event type (`*` and `?` wildcards)")
    command.add_argument(
        "--json", action="store_true", help="one JSON document a line (GET /admin/tail's data)"
    )
    command.set_defaults(run=run)


def describe(event: TailEvent) -> str:
    """One line for people: when, where, which message, what happened, and why it failed."""
    what = event.kind.value
    if event.attempt is not None:
        what += f" (attempt {event.attempt}"
        what += f", {event.destination})" if event.destination else ")"
    elif event.deliveries is not None:
        what += f" (delivery {event.deliveries})"
    fields = [
        event.at.strftime("%Y-%m-%d %H:%M:%S"),
        event.source,
        f"#{event.id}",
        event.message_id,
        event.event_type or "-",
        what,
    ]
    if event.error_type or event.error:
        fields.append(" ".join(f"{event.error_type}: {event.error}".split()))
    return "  ".join(fields)


def run(args: argparse.Namespace) -> Exit:
    # Imported here, not with the parser: `webhook-inbox --help` needs no SQLAlchemy.
    import asyncio

    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C is how a tail ends
        asyncio.run(follow_and_print(args))
    return Exit.OK


async def follow_and_print(args: argparse.Namespace) -> None:
    import sys

    from service.api.admin.tail import TailEventDocument, TailQuery
    from service.commands.admin import validated
    from service.commands.database import operator_engine
    from service.store.tail import follow

    query = validated(
        TailQuery, {"source": args.source, "status": args.status, "event_type": args.event_type}
    )
    async with operator_engine() as engine:
        started = False
        async for events in follow(engine, query.filters()):
            if not started:
                started = True
                print("following; Ctrl-C to stop", file=sys.stderr, flush=True)
            for event in events:
                if args.json:
                    print(TailEventDocument.of(event).model_dump_json())
                else:
                    print(describe(event))
            sys.stdout.flush()
