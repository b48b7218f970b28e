"""The console's pages: overview, messages, one message, dead letters, and the confirmations
before a replay or a bulk retry.

What they show comes from the admin API's own route functions (and so from the same store
queries and documents); this module only picks what a person needs on each page.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import RedirectResponse, Response

from service.api.admin import issues as issues_api
from service.api.admin import messages as messages_api
from service.api.admin import operations
from service.api.admin.destinations import collect_destination_stats, configured_of
from service.api.admin.models import (
    MAX_ID,
    ActivityQuery,
    BulkRetryRequest,
    ConsumerInfo,
    DeadLetterGroup,
    DeadLetterQuery,
    IssueQuery,
    IssueSummary,
    MessageDetail,
    MessageFilters,
    MessagePage,
    MessageQuery,
    SourcePause,
)
from service.api.console import views
from service.api.console.access import ConsoleError, OperatorDep
from service.api.console.templating import fragment, page
from service.api.console.views import FILTER_KEYS, PAGING_KEYS, url
from service.api.problems import ProblemError
from service.api.state import AppState, StateDep
from service.core.schema import UNFINISHED
from service.core.status import IssueStatus
from service.sources.brokers import BrokerSource
from service.sources.config import endpoint_source
from service.store import admin as store
from service.store.admin import MessageFilter

router = APIRouter()

OVERVIEW_REFRESH_SECONDS = 5
MESSAGE_REFRESH_SECONDS = 2
OVERVIEW_ISSUES = 5  # the overview's most recent open issues
DISCARDABLE = frozenset({"pending", "retrying", "dead"})

# What an action did, by the action the history recorded (`?done=` after the redirect).
NOTICES = {
    "admin_retry": "Retried: the message is pending again with a fresh attempt budget. "
    "This page follows it until it is finished.",
    "admin_replay": "Replayed: the message is pending and its handlers will run again. "
    "This page follows it until it is finished.",
    "admin_discard": "Discarded: the message is set aside; a redelivery of it stays a duplicate.",
    "none": "The message was already discarded; nothing changed.",
    "destination_retry": "Retried that destination: the message is pending again and only "
    "the destinations not yet done will run. This page follows it until it is finished.",
    "destination_discard": "Discarded that destination: the message's status now sums up "
    "its other destinations.",
}


# The overview's kind of an endpoint's row (the template links it to the Outbox page).
OUTBOX_KIND = "outbox endpoint"


@dataclass(frozen=True)
class SourceRow:
    name: str
    kind: str  # "" for a source no longer configured
    counts: dict[str, int]
    oldest_unfinished_seconds: float | None
    paused: SourcePause | None = None
    circuit: str | None = None  # its forward's breaker when not closed: "open", "half_open"


@dataclass(frozen=True)
class ConsumerSection:
    """The overview's Consumers: every consumer's row, and each broker source that no fresh,
    connected consumer serves (the sources `GET /readyz` answers 503 for)."""

    rows: list[ConsumerInfo]
    unserved: list[str]


def consumer_section(state: AppState, rows: list[ConsumerInfo]) -> ConsumerSection | None:
    """None with no broker source configured: then there is nothing to consume."""
    brokers = sorted(n for n, s in state.inbox.sources.items() if isinstance(s, BrokerSource))
    if not brokers:
        return None
    served = {row.source for row in rows if row.connected and not row.stale}
    return ConsumerSection(rows, [name for name in brokers if name not in served])


async def open_issues(state: AppState) -> list[IssueSummary]:
    """The overview's most recent open issues, through `GET /admin/issues`."""
    query = IssueQuery(status=[IssueStatus.OPEN], limit=OVERVIEW_ISSUES)
    return (await issues_api.issues(state, query)).items


async def overview_context(state: AppState) -> dict[str, Any]:
    stats = await operations.stats(state)
    activity = await operations.activity(state, ActivityQuery())
    listed = (await operations.sources(state)).sources
    configured = {s.name: s.kind for s in listed}
    # The outbox's endpoints: their outgoing messages are counted as a source's, `outbox:NAME`.
    configured.update((endpoint_source(name), OUTBOX_KIND) for name in state.inbox.endpoints)
    paused = {s.name: s.paused for s in listed}
    circuits = {
        s.name: s.breaker.state for s in listed if s.breaker and s.breaker.state != "closed"
    }
    counted = {s.source: s for s in stats.sources}
    rows = [
        SourceRow(
            name,
            configured.get(name, ""),
            counted[name].counts if name in counted else {},
            counted[name].oldest_pending_age_seconds if name in counted else None,
            paused.get(name),
            circuits.get(name),
        )
        for name in sorted(configured.keys() | counted.keys())
    ]
    return {
        "open_issues": await open_issues(state),
        "stats": stats,
        "backlog": stats.backlog,
        "chart": views.chart(activity.minutes),
        "sources": rows,
        # `stats.consumers` is `GET /admin/consumers`'s list (its `consumer_infos`), read by
        # the stats route whenever a broker source is configured: not read a second time.
        "consumers": consumer_section(state, stats.consumers),
        "statuses": store.STATUSES,
        "now": datetime.now(UTC),
        "refresh_seconds": OVERVIEW_REFRESH_SECONDS,
    }


@router.get("/")
async def overview(state: StateDep, operator: OperatorDep) -> Response:
    """The inbox at a glance: dead letters, the backlog, the last hour, each source, and each
    broker consumer."""
    context = await overview_context(state)
    return operator.page("overview.html", title="Overview", nav="overview", **context)


@router.get("/overview/live")
async def overview_live(state: StateDep, operator: OperatorDep) -> Response:
    """The overview's figures again, for its script to swap in."""
    return fragment("overview_live.html", **await overview_context(state))


def cleaned(request: Request, keys: tuple[str, ...]) -> tuple[list[tuple[str, str]], bool]:
    """The URL's known, non-blank parameters, and whether that is all it had: a filter form
    sends its empty fields too, and the shared link should not carry them."""
    pairs = request.query_params.multi_items()
    items = views.query_items(pairs, keys)
    return items, items == pairs


async def source_names(state: AppState, *, outgoing: bool = True) -> list[str]:
    """The sources a filter offers: the configured ones, then (with `outgoing`) each endpoint's
    `outbox:NAME`, whose outgoing messages are listed, retried and followed like incoming ones."""
    names = [s.name for s in (await operations.sources(state)).sources]
    if outgoing:
        names += [endpoint_source(name) for name in sorted(state.inbox.endpoints)]
    return names


@router.get("/messages")
async def messages(request: Request, state: StateDep, operator: OperatorDep) -> Response:
    """The messages, newest first, filtered as the URL says, a page at a time."""
    items, clean = cleaned(request, FILTER_KEYS + PAGING_KEYS)
    if not clean:
        return RedirectResponse(url("/console/messages", items), status_code=303)
    query, problems = views.parse_query(MessageQuery, items)
    listing = None
    if query is not None:
        try:
            listing = await messages_api.list_messages(state, query)
        except ProblemError as exc:  # an altered or stale cursor, a search refused or too broad
            problems = [exc.detail]
    filters = [(k, v) for k, v in items if k in FILTER_KEYS]
    return operator.page(
        "messages.html",
        title="Messages",
        nav="messages",
        **await listing_context(state, "/console/messages", items, filters, listing, problems),
        chosen_statuses={v for k, v in filters if k == "status"},
        statuses=store.STATUSES,
        conditions=[v for k, v in filters if k == "where"],
        headers=[v for k, v in filters if k == "header"],
        advanced=any(k in ADVANCED_SEARCH_KEYS for k, _ in filters),
        bulk_url=url("/console/bulk-retry", filters),
        export_url=url("/console/messages/export", filters),
    )


# The search fields the messages page keeps under "Advanced search", open when one is set.
ADVANCED_SEARCH_KEYS = frozenset({"id_prefix", "contains", "where", "header"})


@dataclass(frozen=True)
class Paging:
    next_url: str | None  # the next, older page
    first_url: str | None  # back to the newest, when this is not the first page


async def listing_context(
    state: AppState,
    path: str,
    items: list[tuple[str, str]],
    filters: list[tuple[str, str]],
    listing: MessagePage | None,
    problems: list[str],
) -> dict[str, Any]:
    """What a filtered listing page (`path`, asked for with `items`) shows besides its own
    parts: the listing, what is wrong with the URL, the paging links, the filter form's values
    and the sources to filter by."""
    return {
        "listing": listing,
        "problems": problems,
        "paging": paging(path, filters, items, listing),
        "form": dict(filters),
        "sources": await source_names(state),
    }


def paging(
    path: str,
    filters: list[tuple[str, str]],
    items: list[tuple[str, str]],
    listing: MessagePage | None,
) -> Paging:
    """Links to the next page and back to the first, keeping the filters."""
    limit = [(k, v) for k, v in items if k == "limit"]
    next_url = None
    if listing is not None and listing.next_cursor is not None:
        next_url = url(path, [*filters, ("cursor", listing.next_cursor), *limit])
    paged = any(k == "cursor" for k, _ in items)
    return Paging(next_url, url(path, [*filters, *limit]) if paged else None)


def message_number(text: str) -> int:
    if text.isascii() and text.isdigit() and len(text) <= 19 and 1 <= int(text) <= MAX_ID:
        return int(text)
    raise ConsoleError(404, "No such message", "there is no message with that number")


async def load_message(state: AppState, text: str) -> MessageDetail:
    try:
        return await messages_api.get_message(state, message_number(text))
    except ProblemError as exc:
        raise ConsoleError(exc.status, "No such message", exc.detail) from None


def message_state(message: MessageDetail, csrf: str) -> dict[str, Any]:
    """What the refreshed part of a message's page needs: its summary, actions and history."""
    unfinished = message.status in UNFINISHED
    return {
        "m": message,
        "csrf": csrf,
        "can_retry": message.status in store.RETRYABLE,
        "can_replay": message.status == "processed",
        "can_discard": message.status in DISCARDABLE,
        "refresh_seconds": MESSAGE_REFRESH_SECONDS if unfinished else None,
    }


@router.get("/messages/{message}")
async def message(
    message: str, state: StateDep, operator: OperatorDep, done: str | None = None
) -> Response:
    """One message: its state and actions, every attempt, its headers and body."""
    detail = await load_message(state, message)
    return page(
        "message.html",
        title=f"Message {detail.id}",
        nav="messages",
        notice=NOTICES.get(done or ""),
        body=views.body(detail),
        headers=views.header_rows(detail.headers),
        **message_state(detail, operator.csrf),
    )


@router.get("/messages/{message}/live")
async def message_live(message: str, state: StateDep, operator: OperatorDep) -> Response:
    """A message's state, actions and history again, while it is being processed."""
    detail = await load_message(state, message)
    return fragment("message_live.html", **message_state(detail, operator.csrf))


@router.get("/messages/{message}/replay")
async def confirm_replay(message: str, state: StateDep, operator: OperatorDep) -> Response:
    """Ask before replaying: the handlers of a processed message run again."""
    detail = await load_message(state, message)
    if detail.status != "processed":
        raise ConsoleError(
            409,
            "Nothing to replay",
            f"message {detail.id} is {detail.status}; only a processed message is replayed "
            "(a failed one is retried)",
        )
    return operator.page("replay.html", title=f"Replay message {detail.id}", m=detail)


@dataclass(frozen=True)
class GroupRow:
    group: DeadLetterGroup
    show_url: str | None  # its messages; None for the group with no error type on record
    retry_url: str | None  # the bulk retry of the group, which asks first


def group_row(group: DeadLetterGroup, filters: list[tuple[str, str]]) -> GroupRow:
    if group.error_type is None:
        return GroupRow(group, None, None)
    narrowed = [*filters, ("error_type", group.error_type)]
    return GroupRow(
        group,
        url("/console/dead-letters", narrowed),
        url("/console/bulk-retry", [("status", "dead"), *narrowed]),
    )


@router.get("/dead-letters")
async def dead_letters(request: Request, state: StateDep, operator: OperatorDep) -> Response:
    """Dead messages grouped by error type, each group retried at once, and their list."""
    keys = tuple(k for k in FILTER_KEYS if k != "status")
    items, clean = cleaned(request, keys + PAGING_KEYS)
    if not clean:
        return RedirectResponse(url("/console/dead-letters", items), status_code=303)
    query, problems = views.parse_query(DeadLetterQuery, items)
    listing, groups = None, []
    if query is not None:
        filters_only = MessageFilters.model_validate(
            query.model_dump(include=set(MessageFilters.model_fields))
        )
        groups = (await messages_api.dead_letter_groups(state, filters_only)).groups
        try:
            listing = await messages_api.list_dead_letters(state, query)
        except ProblemError as exc:
            problems = [exc.detail]
    filters = [(k, v) for k, v in items if k in keys]
    others = [(k, v) for k, v in filters if k != "error_type"]
    return operator.page(
        "dead_letters.html",
        title="Dead letters",
        nav="dead-letters",
        **await listing_context(state, "/console/dead-letters", items, filters, listing, problems),
        groups=[group_row(group, others) for group in groups],
        all_url=url("/console/dead-letters", others) if len(others) < len(filters) else None,
    )


def bulk_retry_request(items: views.QueryItems) -> BulkRetryRequest:
    """The admin API's bulk retry request for these filters (from a URL or a form)."""
    retry, problems = views.parse_query(BulkRetryRequest, items)
    if retry is None:
        raise ConsoleError(400, "Unusable filters", "; ".join(problems))
    return retry


@router.get("/bulk-retry")
async def confirm_bulk_retry(request: Request, state: StateDep, operator: OperatorDep) -> Response:
    """Count what a bulk retry of these filters would touch (the API's dry run), and ask."""
    items = views.query_items(request.query_params.multi_items(), FILTER_KEYS)
    retry = bulk_retry_request(items)
    counted = await messages_api.bulk_retry(
        state, operator.admin, retry.model_copy(update={"dry_run": True})
    )
    asked: list[str] = [*retry.status] or [*store.BULK_DEFAULT_STATUSES]
    statuses = store.bulk_statuses(messages_api.to_filter(retry, list(retry.status)), force=False)
    return operator.page(
        "bulk_retry.html",
        title="Retry matching messages",
        nav="messages",
        matched=counted.matched,
        statuses=statuses,
        left_out=[s for s in asked if s not in statuses],
        replay_url=url("/console/bulk-action", [("action", "replay"), *items]),
        discard_url=url("/console/bulk-action", [("action", "discard"), *items]),
        filters=items,
        back_url=url("/console/messages", items),
    )


SOURCE_LATEST = 10  # deliveries the source page lists


@router.get("/sources/{name}")
async def source_page(
    name: str, state: StateDep, operator: OperatorDep, done: str | None = None
) -> Response:
    """One source: its configuration, counts, destinations and latest deliveries; whether its
    processing is paused, by whom and why; pause or resume it."""
    listed = {s.name: s for s in (await operations.sources(state)).sources}
    if name not in listed:
        raise ConsoleError(404, "No such source", f"no source {name!r} is configured")
    stats = await operations.stats(state)
    counted = {s.source: s for s in stats.sources}
    pairs = await collect_destination_stats(state.engine, configured_of(state.inbox))
    latest = await messages_api.page(
        state, "messages", MessageFilter(source=name), SOURCE_LATEST, None
    )
    return operator.page(
        "source.html",
        title=f"Source {name}",
        nav="overview",
        source=listed[name],
        counts=counted[name].counts if name in counted else {},
        statuses=store.STATUSES,
        pairs={d.destination: d for d in pairs.destinations if d.source == name},
        latest=latest,
        notice={
            "paused": "Paused: no message of this source is claimed until it is resumed; "
            "deliveries are still accepted.",
            "resumed": "Resumed: the workers claim its messages again.",
        }.get(done or ""),
    )
