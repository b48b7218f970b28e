"""The admin API's request and response documents, each field described for /openapi.json."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from service.core.schema import BulkAction, BulkActionStatus, IssueStatus, Status
from service.store import search

MAX_ID = 2**63 - 1  # inbox ids are PostgreSQL bigints
# JSON nested deeper than this is shown as `body_base64`: pydantic will not serialise past
# about 255 levels, nor Python's json module past its recursion limit, and a deeper body is
# stored whenever its source does not parse it (an id taken from a header).
MAX_PAYLOAD_DEPTH = 100


def _not_a_number(value: object) -> object:
    """pydantic reads a number (or a string of digits) as Unix time; here a time is ISO 8601
    alone, as the schema says, so `received_before=1700000000` is refused, not guessed at."""
    if isinstance(value, bool | int | float) or (
        isinstance(value, str) and value.strip().lstrip("+-").replace(".", "", 1).isdigit()
    ):
        raise ValueError("a time is ISO 8601 (e.g. 2026-01-31T12:00:00Z), not a number")
    return value


def _as_utc(value: datetime) -> datetime:
    """An ISO 8601 time without an offset is read as UTC; every time is compared in UTC."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    try:
        return value.astimezone(UTC)
    except OverflowError:
        raise ValueError("time is out of range") from None


Timestamp = Annotated[datetime, BeforeValidator(_not_a_number), AfterValidator(_as_utc)]
# PostgreSQL text cannot hold NUL; refusing it here turns a driver error into a 422.
Text = Annotated[str, Field(min_length=1, max_length=512, pattern=r"^[^\x00]*$")]


def _no_character_sets(value: str) -> str:
    if "[" in value:
        raise ValueError("`*` and `?` are the wildcards here; character sets ([...]) are not")
    return value


EventTypeGlob = Annotated[Text, AfterValidator(_no_character_sets)]


def _document_text(value: object) -> object:
    """A containment document given as JSON (in a request body) as its text, so that a query
    string and a body are read alike."""
    return value if isinstance(value, str) else json.dumps(value)


def _checked(parse: Callable[[str], object]) -> Callable[[str], str]:
    """A validator keeping `value` once `parse` reads it (a `SearchError` is a ValueError)."""

    def check(value: str) -> str:
        parse(value)
        return value

    return check


SearchText = Annotated[Text, AfterValidator(_checked(search.check_free_text))]
SearchDocument = Annotated[
    str,
    BeforeValidator(_document_text),
    Field(max_length=search.MAX_DOCUMENT_CHARS),
    AfterValidator(_checked(search.parse_document)),
]
SearchCondition = Annotated[
    str, Field(min_length=1, max_length=1000), AfterValidator(_checked(search.parse_condition))
]
SearchHeader = Annotated[
    str, Field(min_length=1, max_length=1000), AfterValidator(_checked(search.parse_header))
]
MAX_CONDITIONS = search.MAX_CONDITIONS
# A source's name, or an endpoint's source (`outbox:NAME`), under which its outgoing messages
# are rows of the inbox (docs/outbox.md).
SOURCE_PATTERN = r"^(outbox:)?[a-z0-9_-]+$"
SourceName = Annotated[str, Field(min_length=1, max_length=200, pattern=SOURCE_PATTERN)]


class EventFilters(BaseModel):
    """The filters on a message's event type and arrival, for the listings, bulk retry and a
    replay to one destination; those given combine with AND."""

    model_config = ConfigDict(extra="forbid")

    event_type: EventTypeGlob | None = Field(
        default=None,
        description="Only messages whose event type matches this glob, as a handler's "
        "`event_types` in the sources file do: `*` matches any run of characters (also none, "
        "and a message without an event type), `?` one character, every other character itself "
        "(`charge.*`, `charge.refund?d`). Without a wildcard, exactly this event type. "
        "Character sets (`[...]`) are refused.",
        examples=["charge.*"],
    )
    received_after: Timestamp | None = Field(
        default=None,
        description="Only messages first received at or after this ISO 8601 time (no offset: UTC).",
    )
    received_before: Timestamp | None = Field(
        default=None,
        description="Only messages first received before this ISO 8601 time (no offset: UTC).",
    )


class MessageFilters(EventFilters):
    """Filters shared by the listings and bulk retry; those given combine with AND."""

    source: SourceName | None = Field(
        default=None,
        description="Only messages of this source (the `{source}` they came to), or "
        "`outbox:NAME` for the outgoing messages to an endpoint.",
    )
    message_id: Text | None = Field(
        default=None, description="Only the message with this dedup key (the sender's id)."
    )
    error_type: Text | None = Field(
        default=None,
        description="Only messages whose latest failed attempt raised this exception type "
        "(the `error_type` of their attempts, e.g. `TimeoutError`).",
    )
    ordering_key: Text | None = Field(
        default=None,
        description="Only messages with this ordering key (the source's `ordering_key` of "
        "them): one key's messages, in the order they are processed.",
    )
    held: bool | None = Field(
        default=None,
        description="`true`: only messages held behind an earlier unfinished message of their "
        "ordering key (`held_behind` set); `false`: only those not held.",
    )
    q: SearchText | None = Field(
        default=None,
        description="Free text: only messages that hold this word as a value anywhere in "
        "their JSON payload (a string, or the number or boolean it also reads as), or whose "
        "dedup key it is: `ch_3Q…`, `cus_9`, `acme@example.com`. The whole value, "
        "case-sensitive.",
        examples=["ch_3QHx2r"],
    )
    id_prefix: Text | None = Field(
        default=None,
        description="Only messages whose dedup key (the sender's id) starts with this.",
        examples=["evt_1Q"],
    )
    contains: SearchDocument | None = Field(
        default=None,
        description="Only messages whose JSON payload contains this JSON document, as "
        "PostgreSQL's `@>` reads it: every key it names with the same value, arrays holding "
        "at least its elements. In a query string, JSON text; in a request body, the document "
        "itself or its text.",
        examples=['{"data": {"object": {"customer": "cus_9"}}}'],
    )
    where: list[SearchCondition] = Field(
        default_factory=list,
        max_length=MAX_CONDITIONS,
        description="Conditions on the JSON payload, each `path=value`, `path!=value`, "
        "`path in a,b,c` or `path exists`; repeat for several (all must hold). A path is keys "
        'joined by dots, a key with dots or spaces quoted as a JSON string (`"x.y"`), `[N]` '
        "for an array's element; a key on an array reaches into its elements. A value is "
        'text, also matching the number, boolean or null it reads as (`42`); quoted (`"42"`), '
        "only that string. `!=`: the path is there and is not that value.",
        examples=[["data.object.customer=cus_9"]],
    )
    header: list[SearchHeader] = Field(
        default_factory=list,
        max_length=MAX_CONDITIONS,
        description="Only messages delivered with this header value, `Name: value` (the name "
        "in any case; the whole value, as stored: redacted headers hold `[redacted]`); repeat "
        "for several.",
        examples=[["X-Shopify-Shop-Domain: acme.myshopify.com"]],
    )

    @model_validator(mode="after")
    def _conditions_bounded(self) -> MessageFilters:
        if len(self.where) + len(self.header) > MAX_CONDITIONS:
            raise ValueError(
                f"a search has at most {MAX_CONDITIONS} conditions and headers together"
            )
        search.check_narrowed(
            [search.parse_condition(c) for c in self.where],
            q=self.q,
            id_prefix=self.id_prefix,
            contains=self.contains,
            header=self.header,
        )
        return self


class PageQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")

    limit: int = Field(default=50, ge=1, le=500, description="Page size, 1 to 500.")
    cursor: str | None = Field(
        default=None,
        max_length=200,
        description="The `next_cursor` of the previous page, unchanged, with the same filters; "
        "a cursor that was altered or belongs to other filters is refused with 400.",
    )


class DeadLetterQuery(MessageFilters, PageQuery):
    """Query parameters of `GET /admin/dead-letters`."""


class StatusFilters(MessageFilters):
    """The filters of `GET /admin/messages`, statuses among them, which its export takes too."""

    status: list[Status] = Field(
        default_factory=list,
        description="Only messages in one of these statuses; repeat the parameter for several.",
    )


class MessageQuery(StatusFilters, PageQuery):
    """Query parameters of `GET /admin/messages`."""


class ExportQuery(StatusFilters):
    """Query parameters of `GET /admin/messages/export`: the listing's filters, no pages."""

    limit: int | None = Field(
        default=None,
        ge=1,
        le=MAX_ID,
        description="Export at most this many messages (the newest that match); none: every "
        "one that matches.",
    )


def attempts_text(since_retry: int, total: int) -> str:
    """Both attempt counts as the command line and the console show them (of a message or of
    one of its destinations): `6`, or once an operator has retried it, `1 since retry, 6 in
    all`."""
    if since_retry == total:
        return str(total)
    return f"{since_retry} since retry, {total} in all"


class MessageSummary(BaseModel):
    """A message as the listings show it."""

    id: int = Field(description="The inbox row id, used in the admin paths.")
    source: str = Field(description="The source the message came to.")
    message_id: str = Field(description="The sender's message id: the dedup key.")
    event_type: str | None = Field(description="The event type, when the source names one.")
    status: Status = Field(
        description="Where the message is in processing (`processing`: an attempt is in flight)."
    )
    attempt_count: int = Field(
        description="Processing attempts since the message was accepted or last retried by an "
        "operator: those used of its current budget of `max_attempts`."
    )
    attempt_count_total: int = Field(
        description="Processing attempts in all, across operators' retries: the number of its "
        "latest attempt in the history."
    )
    receive_count: int = Field(description="Deliveries received: 1, plus one per duplicate.")
    received_at: datetime = Field(description="When the first delivery was recorded.")
    last_received_at: datetime = Field(description="When the latest delivery arrived.")
    next_attempt_at: datetime | None = Field(
        description="When the worker may next try it; null once no attempt is to come "
        "(`processing`, `processed`, `dead`, `discarded`)."
    )
    processed_at: datetime | None = Field(description="When its handlers committed, if they did.")
    last_error: str | None = Field(description="The error of the latest failed attempt, if any.")
    ordering_key: str | None = Field(
        default=None,
        description="The source's `ordering_key` of the message: messages with one key are "
        "processed one at a time, in the order they were accepted. Null: unordered.",
    )
    held_behind: int | None = Field(
        default=None,
        description="The inbox id of the earlier message of its key that this one waits for "
        "(pending, retrying, processing or dead); discard or retry that one to release it. "
        "Null when it waits for none: its `status` then says where it is.",
    )

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> MessageSummary:
        return cls.model_validate({**row, "attempt_count": row["attempts"]})

    def status_text(self) -> str:
        """The status as the command line's list shows it: `pending`, or for a message its
        ordering key holds, `pending, held behind 17`."""
        if self.held_behind is None:
            return self.status.value
        return f"{self.status.value}, held behind {self.held_behind}"

    def attempts_text(self) -> str:
        return attempts_text(self.attempt_count, self.attempt_count_total)


class MessagePage(BaseModel):
    items: list[MessageSummary] = Field(description="The page, newest first.")
    next_cursor: str | None = Field(
        description="Pass as `cursor` for the next page; null on the last page."
    )


class Attempt(BaseModel):
    """One entry of a message's history: a processing attempt, or an admin action."""

    attempt: int = Field(
        description="The attempt's number (1-based, counting on across admin retries: 1, 2, "
        "3, admin_retry, 4); for an admin action, the attempts the message had made when it "
        "was taken."
    )
    started_at: datetime = Field(description="When the attempt (or action) started.")
    finished_at: datetime | None = Field(description="When it finished; null while running.")
    outcome: str = Field(
        description="What happened: the worker's outcome, or `admin_retry`, `admin_replay` or "
        "`admin_discard` for an admin action."
    )
    error_type: str | None = Field(description="The exception type of a failed attempt.")
    error: str | None = Field(description="The error message of a failed attempt.")
    traceback: str | None = Field(description="A bounded traceback of a failed attempt.")
    duration_ms: float | None = Field(description="How long the attempt took.")
    actor: str | None = Field(
        description="Who recorded it: for an admin action, the fingerprint of the admin token "
        "used (`token:` and a SHA-256 prefix, never the token), prefixed `console:` when it "
        "was taken in the web console; for an attempt, the worker (`worker:host:pid`)."
    )
    destination: str | None = Field(
        default=None,
        description="The named destination this attempt ran or this action was taken on; "
        "null for a source without named destinations, and for the whole message.",
    )


class DestinationState(BaseModel):
    """Where a message stands with one named destination of its source."""

    name: str = Field(description="The destination's name (`[sources.X.destinations.NAME]`).")
    status: Status = Field(
        description="`pending` (to run), `retrying`, `processed`, `dead` or `discarded`."
    )
    attempts: int = Field(
        description="Attempts this destination has made for the message, in all (as "
        "`attempt_count_total`; kept for existing clients)."
    )
    attempt_count: int = Field(
        description="Its attempts since an operator last ran it again (a retry or replay of "
        "it, or of the whole message, that ran it); as many as `attempt_count_total` when "
        "none has."
    )
    attempt_count_total: int = Field(
        description="Its attempts in all, across operators' retries: its attempt rows in the "
        "history."
    )
    last_error: str | None = Field(description="The error of its latest failed attempt.")
    updated_at: datetime = Field(description="When its state last changed.")
    processed_at: datetime | None = Field(description="When its effects committed, if they did.")

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> DestinationState:
        return cls.model_validate(
            {
                **row,
                "attempt_count": min(row["attempts_since"], row["attempts"]),
                "attempt_count_total": row["attempts"],
            }
        )

    def attempts_text(self) -> str:
        """Both counts, as a message's (`attempts_text`)."""
        return attempts_text(self.attempt_count, self.attempt_count_total)


class MessageDelivery(MessageSummary):
    """A message with what was delivered: its summary, content type, headers and body. One line
    of an export (`GET /admin/messages/export`); a message's detail adds its history."""

    content_type: str | None = Field(description="The delivery's content type.")
    headers: dict[str, str] = Field(
        description="The delivery's headers; credentials and signatures were redacted at ingest."
    )
    payload: Any = Field(
        default=None,
        description="The body parsed as JSON, when it is JSON; otherwise null and "
        "`body_base64` holds the bytes. A JSON body nested more than "
        f"{MAX_PAYLOAD_DEPTH} levels deep, or holding what a JSON answer cannot (NaN, "
        "Infinity, an unpaired surrogate escape), is shown as `body_base64` too.",
    )
    body_base64: str | None = Field(
        default=None, description="The raw body in base64, when it is not JSON."
    )


class MessageDetail(MessageDelivery):
    """A message with its delivery and its whole history."""

    attempts: list[Attempt] = Field(description="Attempts and admin actions, oldest first.")
    destinations: list[DestinationState] = Field(
        default_factory=list,
        description="Of a source with named destinations: each destination that has run for "
        "the message (or been replayed to), by name; the message's `status` summarises them. "
        "Empty for a source without named destinations.",
    )
    trace_id: str | None = Field(
        default=None,
        description="The W3C trace id of the delivery's trace (32 hex digits), to look the "
        "delivery and its attempts up in a tracing backend; null when none was stored "
        "(tracing off and no trace context in the event).",
    )


class RetryRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    force: bool = Field(
        default=False,
        description="Also replay a `processed` message (its handlers run again); without it "
        "a processed message answers 409.",
    )


class RetryResult(MessageSummary):
    """The message after the retry or discard."""

    action: str = Field(
        description="The action recorded in the history: `admin_retry`, `admin_replay`, "
        "`admin_discard`, or `none` when the message was already discarded."
    )


class BulkRetryRequest(MessageFilters):
    """The list filters, chosen messages to retry, and how."""

    status: list[Status] = Field(
        default_factory=list,
        description="Statuses to retry; default `retrying` and `dead`. `discarded` must be "
        "named to be retried, `processed` must be named and forced; others never match.",
    )
    force: bool = Field(
        default=False, description="Allow replaying `processed` messages named in `status`."
    )
    dry_run: bool = Field(default=False, description="Only count the matching messages.")


class DestinationReplayRequest(EventFilters):
    """Which of the source's messages to replay to one destination, and how."""

    status: list[Status] = Field(
        default_factory=list,
        description="Only messages in these statuses; default every status but `processing` "
        "(a message in flight is never taken).",
    )
    dry_run: bool = Field(default=False, description="Only count the matching messages.")


class BulkActionRequest(MessageFilters):
    """A bulk action over every message the filters match (the search), or (`dry_run`) only
    its count."""

    # The rule of `destination_of_its_replay` in the schema too, so that a client (or a
    # generator of valid requests) knows it.
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "if": {"properties": {"action": {"const": "replay_destination"}}},
            "then": {
                "required": ["destination", "source"],
                "properties": {"destination": {"type": "string"}, "source": {"type": "string"}},
            },
            "else": {"properties": {"destination": {"type": "null"}}},
        },
    )

    action: BulkAction = Field(
        description="`retry`: the failed (or named discarded) messages get a fresh attempt "
        "budget, as `POST /admin/messages/retry`; `replay`: the same, processed messages "
        'too, as it does with `{"force": true}`; `discard`: set aside, as `POST '
        "/admin/messages/{id}/discard` does one; `replay_destination`: run `destination` "
        "for the `source`'s messages, as `POST /admin/sources/{source}/destinations/{name}/"
        "replay`."
    )
    destination: str | None = Field(
        default=None,
        pattern=r"^[a-z0-9][a-z0-9_-]{0,63}$",
        description="The named destination of a `replay_destination` (which needs `source` "
        "too); no other action takes one.",
    )
    status: list[Status] = Field(
        default_factory=list,
        description="Only messages in these statuses, of those the action may change. "
        "Default: `retrying` and `dead` for `retry` and `discard` (`pending` and `processing` "
        "must be named to be discarded, `discarded` to be retried); those and `processed` for "
        "`replay`; every status but `processing` for `replay_destination`.",
    )
    dry_run: bool = Field(
        default=False, description="Only count the matching messages; nothing is recorded."
    )

    @model_validator(mode="after")
    def destination_of_its_replay(self) -> BulkActionRequest:
        if self.action == BulkAction.REPLAY_DESTINATION:
            if self.destination is None or self.source is None:
                raise ValueError("a replay_destination names its `destination` and `source`")
        elif self.destination is not None:
            raise ValueError(f"`destination` is for replay_destination, not {self.action}")
        return self


class BulkActionCount(BaseModel):
    """A bulk action's dry run."""

    matched: int = Field(description="Messages the action would change now.")


class BulkActionDocument(BaseModel):
    """A bulk action: what it does, to which search, who ran it, and its progress."""

    id: int = Field(description="The action's id, for its progress and its resumption.")
    action: BulkAction = Field(description="What it does to each matching message.")
    destination: str | None = Field(description="The destination of a `replay_destination`.")
    query: dict[str, Any] = Field(
        description="The filters as the operator gave them (the request without `action`, "
        "`destination` and `dry_run`)."
    )
    actor: str = Field(
        description="Who started it: the admin token's fingerprint (`console:` first from "
        "the web console; `cli:user@host` from the command line)."
    )
    status: BulkActionStatus = Field(
        description="`running`; `interrupted` (its runner was stopped: resume it); "
        "`finished`. A `running` one whose `updated_at` is over 30 s old lost its runner and "
        "may be resumed."
    )
    matched: int = Field(description="Messages matched when it began.")
    done: int = Field(
        description="Messages changed so far: at most `matched` (fewer when some changed "
        "state meanwhile, or a worker held them)."
    )
    after_id: int = Field(
        description="Its position: every matching message up to this id has been walked; "
        "a resumption continues above it."
    )
    last_id: int | None = Field(
        description="The highest id matched when it began: its walk ends there (messages "
        "arriving later are not taken). Null when nothing matched."
    )
    created_at: datetime = Field(description="When it began.")
    updated_at: datetime = Field(description="Its last batch (its runner's heartbeat).")
    finished_at: datetime | None = Field(description="When it finished; null until then.")


class BulkActionList(BaseModel):
    items: list[BulkActionDocument] = Field(description="The bulk actions, newest first.")


class BulkActionListQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")

    limit: int = Field(default=50, ge=1, le=500, description="At most this many, 1 to 500.")


class BulkRetryResult(BaseModel):
    matched: int = Field(description="Messages matching the filter in a status a retry may leave.")
    retried: int = Field(
        description="Messages moved to `pending` (0 for a dry run; fewer than `matched` when "
        "some changed state or were being processed meanwhile)."
    )


class SourceStats(BaseModel):
    source: str = Field(description="The source name (also sources no longer configured).")
    counts: dict[str, int] = Field(description="Messages by status; statuses with none omitted.")
    total: int = Field(description="All of the source's messages.")
    oldest_pending_age_seconds: float | None = Field(
        description="Age of its oldest unfinished (pending, retrying, processing) message."
    )


class RateLimitStats(BaseModel):
    source: str = Field(description="A source with a `rate_limit`, or one of its destinations'.")
    destination: str | None = Field(
        default=None,
        description="The named destination whose `rate_limit` this is; null for the source's.",
    )
    rate_limit: str = Field(description="Its limit, as configured (`100/s`, `30/m`).")
    per_second: float = Field(description="The limit in messages a second.")
    current_per_second: float = Field(
        description="Messages of the source (of a destination: its runs) whose attempt started "
        "in the last 10 seconds, a second: what the workers run now, all processes together."
    )
    tokens: float = Field(
        description="Messages that may be claimed at once now (the shared bucket, refilled at "
        "the limit up to one second's worth); below 0 by the tokens promised to a destination's "
        "queued runs (each slot's token is taken when the slot is given)."
    )
    wait_seconds: float = Field(
        description="How long a message over the limit waits for the next token now; 0 when "
        "one is there."
    )


class ConsumerInfo(BaseModel):
    """A broker consumer process's state for one source, as it last wrote it
    (`inbox_consumers`)."""

    source: str = Field(description="The broker source.")
    consumer: str = Field(description="The process: `hostname:pid`.")
    connected: bool = Field(description="Connected to the broker and subscribed.")
    state: str = Field(
        description="`starting`, `connecting`, `connected`, `waiting for the database` or "
        "`disconnected`."
    )
    last_error: str | None = Field(
        description="Why it last lost the broker (or could not record, the database away)."
    )
    lag: int | None = Field(
        description="Messages waiting on the broker for the source, as last read (at most "
        "every 5 s); null where the broker does not say."
    )
    counts: dict[str, int] = Field(
        description="Messages settled by this process, by outcome: accepted, duplicate, "
        "dead_lettered, released, ack_lost."
    )
    started_at: datetime = Field(description="Its first report.")
    updated_at: datetime = Field(description="Its last report (every 5 s, and on each change).")
    stale: bool = Field(
        description="Not written for 15 s: the process died without its clean stop, or cannot "
        "reach the database. Not counted by readyz nor the metrics."
    )


class ConsumerList(BaseModel):
    consumers: list[ConsumerInfo] = Field(description="By source, then process.")


class IssueQuery(BaseModel):
    """Query parameters of `GET /admin/issues`."""

    model_config = ConfigDict(extra="forbid")

    source: SourceName | None = Field(default=None, description="Only this source's issues.")
    status: list[IssueStatus] = Field(
        default_factory=list,
        description="Only issues in one of these statuses; repeat the parameter for several.",
    )
    limit: int = Field(default=50, ge=1, le=500, description="At most this many, 1 to 500.")


class IssueSummary(BaseModel):
    """The failed attempts of one cause (`inbox_issues`), and its messages now unfinished and
    dead."""

    fingerprint: str = Field(
        description="The first 16 hex of the sha256 of the parts below: the same in every "
        "process and after a restart, and unchanged by an edit that only moves lines."
    )
    source: str
    destination: str | None = Field(description="The named destination, if the source has any.")
    handler: str | None = Field(description="The handler that raised, `module:function`.")
    error_type: str = Field(description="The exception type, or `ForwardFailed`, … .")
    frame: str | None = Field(
        description="The innermost frame of the application's own code (neither the inbox's "
        "nor a library's), `module:function`."
    )
    detail: str | None = Field(
        description="Of a forward: its HTTP status class (`5xx`, `429`, `4xx`), `timeout` or "
        "connection error kind, and its endpoint (`host:port/path`, or the outbox endpoint)."
    )
    status: IssueStatus = Field(
        description="`open`, `acknowledged`, `resolved` (open again when it fails again) or "
        "`ignored`."
    )
    acknowledged_by: str | None = Field(
        description="Who took the last decision on it (acknowledged, resolved, ignored or "
        "reopened it), as they gave their name."
    )
    note: str | None = Field(description="The latest note given with a decision.")
    first_seen: datetime
    last_seen: datetime
    reopened_at: datetime | None = Field(description="When it last failed again once resolved.")
    failed_attempts: int = Field(description="Failed attempts counted on it, in all.")
    sample_error: str | None = Field(description="The latest failure's message.")
    sample_traceback: str | None = Field(description="The latest failure's traceback.")
    retrying: int = Field(
        description="Messages now `retrying` whose latest failed attempt has this fingerprint."
    )
    dead: int = Field(
        description="Messages now `dead` whose latest failed attempt has this fingerprint."
    )


FINGERPRINT_PATTERN = r"^[0-9a-f]{16}$"


class IssueDetailQuery(BaseModel):
    """Query parameters of `GET /admin/issues/{fingerprint}`."""

    model_config = ConfigDict(extra="forbid")

    limit: int = Field(
        default=50, ge=1, le=500, description="At most this many messages, 1 to 500."
    )


class IssueDetail(IssueSummary):
    """An issue and its messages."""

    messages: list[MessageSummary] = Field(
        description="Its messages, newest first (at most `limit`): those whose latest failed "
        "attempt has its fingerprint, in any status (a retried one processed since too)."
    )


class IssueAction(BaseModel):
    """Who takes a decision on an issue, and why: kept with the issue and shown with it."""

    model_config = ConfigDict(extra="forbid")

    operator: Text = Field(description="Your name, as others know you.")
    note: Text | None = Field(
        default=None,
        description="Why, for whoever finds it: e.g. `fixed in 1.4.2, INC-4211`; without "
        "one, the issue keeps its note.",
    )


class IssueRetryRequest(BaseModel):
    """Resolve an issue and retry its dead messages, or (`dry_run`) only count them."""

    model_config = ConfigDict(extra="forbid")

    operator: Text | None = Field(
        default=None,
        description="Your name, as others know you: the issue is resolved under it (without "
        "one, under the admin token's fingerprint).",
    )
    dry_run: bool = Field(default=False, description="Only count the issue's dead messages.")


class IssueList(BaseModel):
    items: list[IssueSummary] = Field(description="Most recent `last_seen` first.")


class Stats(BaseModel):
    total: int = Field(description="All messages in the inbox.")
    by_status: dict[str, int] = Field(description="Messages by status, every status listed.")
    sources: list[SourceStats] = Field(description="Per source, by name.")
    oldest_pending_age_seconds: float | None = Field(
        description="Age in seconds of the oldest unfinished (pending, retrying or processing) "
        "message; null when there is none."
    )
    attempts_last_hour: int = Field(description="Processing attempts started in the last hour.")
    failures_last_hour: int = Field(
        description="Of those, attempts that failed (the message was retried or dead-lettered)."
    )
    admin_actions_last_hour: int = Field(description="Admin retries, replays and discards.")
    backlog: int = Field(
        default=0,
        description="Messages not yet finished (pending, retrying or processing): what the "
        "workers have left to do.",
    )
    drain_rate_per_second: float = Field(
        default=0.0,
        description="Messages the workers finished well per second, over the last 10 seconds "
        "(succeeded attempts).",
    )
    arrival_rate_per_second: float = Field(
        default=0.0,
        description="New messages received per second, over the last 10 seconds (duplicates "
        "not counted).",
    )
    catch_up_seconds: float | None = Field(
        default=None,
        description="An estimate of the time left to work off the backlog: the backlog over "
        "the drain rate less the arrival rate. 0 with no backlog; null while the backlog is "
        "not shrinking (workers stopped, paused, or slower than ingest).",
    )
    rate_limits: list[RateLimitStats] = Field(
        default_factory=list,
        description="Each rate limit's rate and wait: the sources', then their destinations', "
        "by name.",
    )
    consumers: list[ConsumerInfo] = Field(
        default_factory=list,
        description="Each broker consumer process's state (as `GET /admin/consumers`); empty "
        "when no broker source is configured.",
    )


class HandlerInfo(BaseModel):
    target: str = Field(description="The handler, as `module:function`.")
    event_types: list[str] = Field(description="Event type globs it runs for.")


class ForwardInfo(BaseModel):
    url: str = Field(description="Where messages are POSTed; a password in the URL is hidden.")
    timeout_seconds: float = Field(description="Timeout of one forwarding request.")


class DestinationInfo(BaseModel):
    name: str = Field(description="The destination's name.")
    event_types: list[str] = Field(description="Event type globs it receives.")
    payload_filter: bool = Field(description="Whether it has a payload filter too.")
    handlers: list[HandlerInfo] = Field(description="Its Python handlers, if it runs any.")
    forward: ForwardInfo | None = Field(description="Its HTTP endpoint, if it forwards.")
    rate_limit: str | None = Field(
        default=None, description="Its `rate_limit` as configured (`30/m`); null: none."
    )


class BreakerState(BaseModel):
    """The circuit breaker of a forward (a source's, or a named destination's), shared by every
    process."""

    state: Literal["closed", "open", "half_open"] = Field(
        description="`closed`: forwarding; `open`: left alone until `open_until`, its messages "
        "waiting with no attempt spent; `half_open`: the cool-down is over, one probe decides."
    )
    failures: int = Field(description="Failures in a row (connection errors, timeouts, 5xx).")
    open_until: datetime | None = Field(description="While open: when the cool-down ends.")
    opened_at: datetime | None = Field(description="When it last opened, while not closed.")
    last_error: str | None = Field(description="The last failure that counted (its cause).")


class DestinationStats(BaseModel):
    source: str = Field(description="The source.")
    destination: str = Field(description="The destination's name.")
    counts: dict[str, int] = Field(
        description="(message, destination) pairs by status; statuses with none omitted."
    )
    total: int = Field(description="All of the destination's pairs.")
    breaker: BreakerState | None = Field(
        default=None,
        description="A forward destination's circuit breaker, once it has forwarded; null "
        "otherwise.",
    )


class DestinationStatsList(BaseModel):
    destinations: list[DestinationStats] = Field(
        description="Every configured destination, and any other that has pairs stored, by "
        "source and name."
    )


class PauseRequest(BaseModel):
    """Who pauses a source's processing, and why: kept with the pause and shown with it."""

    model_config = ConfigDict(extra="forbid")

    operator: Text = Field(description="The name of the person pausing it, as others know them.")
    reason: Text = Field(
        description="Why, for whoever finds it paused: e.g. `billing API down, INC-4211`."
    )


class SourcePause(BaseModel):
    """A source's processing, paused: ingest accepts its deliveries; no worker claims them."""

    paused_at: datetime = Field(description="When it was paused.")
    operator: str = Field(description="Who paused it (their name, as given).")
    reason: str = Field(description="Why.")
    actor: str | None = Field(
        description="The admin token's fingerprint (`console:` first from the web console; "
        "`cli:user@host` from the command line)."
    )


class PauseResult(BaseModel):
    source: str = Field(description="The source.")
    paused: SourcePause | None = Field(description="The pause in force; null once resumed.")
    changed: bool = Field(description="Whether this call changed anything.")


class SourceInfo(BaseModel):
    """A configured source, without any secret."""

    name: str = Field(description="The `{source}` of `POST /webhooks/{source}`.")
    kind: str = Field(description="How deliveries are verified and identified.")
    mode: Literal["async", "sync"] = Field(description="`async` (worker) or `sync` (in request).")
    max_attempts: int = Field(description="Attempts before a message becomes dead.")
    handlers: list[HandlerInfo] = Field(description="Python handlers run for each message.")
    forward: ForwardInfo | None = Field(description="The HTTP destination, if any.")
    destinations: list[DestinationInfo] = Field(
        default_factory=list,
        description="Its named destinations, in configuration order (instead of `handlers` "
        "and `forward`).",
    )
    redelivery_days: float = Field(
        description="How long the kind's senders may redeliver: retention never prunes sooner."
    )
    rate_limit: str | None = Field(
        default=None,
        description="Its `rate_limit` as configured (`100/s`): messages claimed a second, by "
        "every process together; null: none.",
    )
    ordering_key: str | None = Field(
        default=None,
        description="Its `ordering_key` (`/json/pointer` or `header:Name`): messages of one key "
        "run one at a time, in order; null: unordered.",
    )
    paused: SourcePause | None = Field(
        default=None, description="Its processing's pause, if an operator has paused it."
    )
    breaker: BreakerState | None = Field(
        default=None,
        description="Its forward's circuit breaker, once it has forwarded; null otherwise.",
    )


class SourceList(BaseModel):
    sources: list[SourceInfo] = Field(description="By name.")


class EndpointInfo(BaseModel):
    """An endpoint of the outbox (`[endpoints.NAME]`) and its outgoing messages, without any
    secret."""

    name: str = Field(description="The endpoint's name, as `ctx.outbox.send` takes it.")
    source: str = Field(
        description="The source its outgoing messages are listed under (`outbox:NAME`): "
        "`GET /admin/messages?source=outbox:NAME` lists them, and the message operations "
        "(retry, discard, bulk retry) take them as they take incoming ones."
    )
    url: str = Field(description="Where its messages are POSTed; a password in it is hidden.")
    timeout_seconds: float = Field(description="Timeout of one request.")
    signed: bool = Field(description="Whether each request carries a Standard Webhooks signature.")
    max_attempts: int = Field(description="Attempts before an outgoing message is dead.")
    rate_limit: str | None = Field(description="Its `rate_limit` as configured; null: none.")
    keep_keys_days: float = Field(
        description="How long a sent or dead message's key is kept at least (its retention floor)."
    )
    counts: dict[str, int] = Field(
        description="Outgoing messages by status (pending, processing, retrying, processed, "
        "dead, discarded); statuses with none omitted."
    )
    total: int = Field(description="All of its outgoing messages.")
    oldest_pending_age_seconds: float | None = Field(
        description="Age of its oldest unsent (pending, retrying, processing) message."
    )
    paused: SourcePause | None = Field(
        default=None, description="The pause holding its messages, if any."
    )
    breaker: BreakerState | None = Field(
        default=None,
        description="Its circuit breaker as every process sees it; null until first asked.",
    )


class EndpointList(BaseModel):
    endpoints: list[EndpointInfo] = Field(description="By name.")


class PruneResult(BaseModel):
    deleted: int = Field(description="Rows deleted in all.")
    by_status: dict[str, int] = Field(description="Deleted rows by the status they had.")
    by_source: dict[str, int] = Field(
        description="Deleted rows by source; `(unconfigured)` for sources no longer configured."
    )


class MinuteActivity(BaseModel):
    minute: datetime = Field(description="The start of the minute (UTC).")
    received: int = Field(
        description="Messages first received in that minute (duplicates are not counted here; "
        "they raise a message's `receive_count`)."
    )
    processed: int = Field(description="Attempts started in that minute that succeeded.")
    failed: int = Field(
        description="Attempts started in that minute that failed (retried or dead-lettered)."
    )


class Activity(BaseModel):
    minutes: list[MinuteActivity] = Field(
        description="One entry per minute, oldest first; the last is the current, partial minute."
    )


class ActivityQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")

    minutes: int = Field(
        default=60, ge=1, le=1440, description="How many minutes back, 1 to 1440 (default 60)."
    )


class DeadLetterGroup(BaseModel):
    """Dead messages that failed the same way."""

    error_type: str | None = Field(
        description="The exception type of their latest failed attempt; null for messages "
        "with no failed attempt on record."
    )
    count: int = Field(description="Dead messages in the group.")
    sources: list[str] = Field(description="The sources they came to, by name.")
    oldest_received_at: datetime = Field(description="When the oldest of them was received.")
    newest_received_at: datetime = Field(description="When the newest of them was received.")
    latest_error: str | None = Field(description="The newest message's last error line.")


class DeadLetterGroups(BaseModel):
    groups: list[DeadLetterGroup] = Field(
        description="Largest group first. Retry one with `POST /admin/messages/retry` and "
        '`{"status": ["dead"], "error_type": ...}`.'
    )
