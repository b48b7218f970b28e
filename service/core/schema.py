"""The inbox's tables, declared once: SQLModel models that Alembic's migrations must match.

The hot statements (group-commit insert, claim, finish) are hand-written SQL over these
tables, not an ORM unit of work; the models are the schema's single description, checked
against `alembic upgrade head` by a test that compares `pg_dump --schema-only` of both.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Double,
    Identity,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    SmallInteger,
    Table,
    Text,
    UniqueConstraint,
    event,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Connection
from sqlmodel import Field, SQLModel

# Re-exported: the tables' users import the statuses with them.
from service.core.status import DUE as DUE
from service.core.status import ENDED as ENDED
from service.core.status import SETTLED as SETTLED
from service.core.status import UNFINISHED as UNFINISHED
from service.core.status import BulkAction as BulkAction
from service.core.status import BulkActionStatus as BulkActionStatus
from service.core.status import IssueStatus as IssueStatus
from service.core.status import Status as Status
from service.core.status import sql_list as sql_list


def _now() -> Any:
    return text("now()")


# The tables that churn a row per message or per claim are vacuumed after 1,000 dead rows
# whatever their size, unthrottled (0016): at the defaults, a drain left up to 900,000 dead
# claims between autovacuum's visits.
CHURNING_TABLE_OPTIONS = {
    "postgresql_with": {
        "autovacuum_vacuum_scale_factor": "0",
        "autovacuum_vacuum_threshold": "1000",
        "autovacuum_vacuum_cost_delay": "0",
    }
}


def _identity_key() -> Any:
    """A table's `id`: a bigint the database numbers (GENERATED ALWAYS), None until inserted."""
    return Field(
        default=None, sa_column=Column(BigInteger, Identity(always=True), primary_key=True)
    )


class InboxTable(SQLModel):
    """The inbox's own metadata, apart from `SQLModel.metadata`, where handler authors'
    tables go: Alembic compares the migrations with these tables only."""

    metadata = MetaData()


class MessageRecord(InboxTable, table=True):
    """`inbox_messages`: one row per `(source, message_id)`, the dedup key."""

    __tablename__ = "inbox_messages"
    __table_args__ = (
        # The dedup key: ingest's INSERT fails on it, and its ON CONFLICT counts redeliveries.
        UniqueConstraint("source", "message_id", name="inbox_messages_source_message_id_key"),
        CheckConstraint(
            "length(message_id) BETWEEN 1 AND 512", name="inbox_messages_message_id_check"
        ),
        CheckConstraint(
            f"status IN ({sql_list(list(Status))})", name="inbox_messages_status_check"
        ),
        # The worker's "due messages" query: a small partial index over the unfinished rows
        # without an ordering key (0015: keyed ones are claimed from their keys' heads).
        Index(
            "inbox_messages_due_idx",
            "next_attempt_at",
            "id",
            postgresql_where=text(f"status IN ({sql_list(DUE)}) AND ordering_key IS NULL"),
        ),
        # The due messages whose last attempt never finished, claimed one at a time: a tiny
        # index, so looking for them each poll costs nothing however large the backlog (0006).
        Index(
            "inbox_messages_alone_idx",
            "next_attempt_at",
            "id",
            postgresql_where=text(f"run_alone AND status IN ({sql_list(DUE)})"),
        ),
        # Expired claims of crashed workers.
        Index(
            "inbox_messages_lease_idx",
            "locked_until",
            postgresql_where=text(f"status = '{Status.PROCESSING.value}'"),
        ),
        # Admin listing: newest first, overall and by source / status; retention by age.
        Index("inbox_messages_received_idx", text("received_at DESC"), text("id DESC")),
        Index(
            "inbox_messages_source_received_idx",
            "source",
            text("received_at DESC"),
            text("id DESC"),
        ),
        # Listing by a status other than processed (dead letters, a backlog): processed rows,
        # most of the table, stay out of it, so finishing a message adds no entry (0003).
        Index(
            "inbox_messages_status_received_idx",
            "status",
            text("received_at DESC"),
            text("id DESC"),
            postgresql_where=text(f"status <> '{Status.PROCESSED.value}'"),
        ),
        Index("inbox_messages_event_type_idx", "event_type"),
        # The redelivered messages by their latest delivery, for `tail` to show duplicates
        # (0019): a first delivery adds no entry, only a redelivery does.
        Index(
            "inbox_messages_redelivered_idx",
            "last_received_at",
            postgresql_where=text("receive_count > 1"),
        ),
        # The unfinished messages of each ordering key (0012): a claim passes over a message
        # while an earlier one of its key is here, and the admin names it ("held behind").
        Index(
            "inbox_messages_ordering_idx",
            "source",
            "ordering_key",
            "id",
            postgresql_where=text(
                f"ordering_key IS NOT NULL AND status NOT IN ({sql_list(SETTLED)})"
            ),
        ),
        # Search (0025, service/store/search.py): the payload's keys and values, the stored
        # headers' values, and the dedup key's prefix in byte order.
        Index(
            "inbox_messages_payload_idx",
            text("inbox_payload(body)"),
            postgresql_using="gin",
            postgresql_where=text("searchable"),
        ),
        Index(
            "inbox_messages_headers_idx",
            "headers",
            postgresql_using="gin",
            postgresql_ops={"headers": "jsonb_path_ops"},
            postgresql_with={"fastupdate": "off"},
        ),
        Index(
            "inbox_messages_message_id_prefix_idx",
            "message_id",
            postgresql_ops={"message_id": "text_pattern_ops"},
        ),
    )

    id: int | None = _identity_key()
    source: str = Field(sa_column=Column(Text, nullable=False))
    message_id: str = Field(sa_column=Column(Text, nullable=False))
    event_type: str | None = Field(default=None, sa_column=Column(Text))
    status: str = Field(
        default=Status.PENDING.value,
        sa_column=Column(Text, nullable=False, server_default=text("'pending'")),
    )
    attempts: int = Field(
        default=0, sa_column=Column(Integer, nullable=False, server_default=text("0"))
    )
    receive_count: int = Field(
        default=1, sa_column=Column(Integer, nullable=False, server_default=text("1"))
    )
    received_at: datetime | None = Field(
        default=None,
        sa_column=Column(DateTime(timezone=True), nullable=False, server_default=_now()),
    )
    last_received_at: datetime | None = Field(
        default=None,
        sa_column=Column(DateTime(timezone=True), nullable=False, server_default=_now()),
    )
    next_attempt_at: datetime | None = Field(
        default=None,
        sa_column=Column(DateTime(timezone=True), nullable=False, server_default=_now()),
    )
    locked_until: datetime | None = Field(default=None, sa_column=Column(DateTime(timezone=True)))
    processed_at: datetime | None = Field(default=None, sa_column=Column(DateTime(timezone=True)))
    last_error: str | None = Field(default=None, sa_column=Column(Text))
    headers: dict[str, str] = Field(
        default_factory=dict,
        sa_column=Column(JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    )
    body: bytes = Field(sa_column=Column(LargeBinary, nullable=False))
    content_type: str | None = Field(default=None, sa_column=Column(Text))
    # Set when an expired claim is reaped (its worker died or hung mid-attempt), cleared when
    # an attempt finishes: such a message is claimed on its own (0002).
    run_alone: bool = Field(
        default=False,
        sa_column=Column(Boolean, nullable=False, server_default=text("false")),
    )
    # The W3C trace context of the delivery's span, for the attempts' spans to continue (0004).
    trace_context: dict[str, str] | None = Field(default=None, sa_column=Column(JSONB))
    # `attempts` when the current attempt budget began: an admin retry gives a fresh budget
    # (`max_attempts` more) but keeps the numbering going (0005).
    budget_start: int = Field(
        default=0, sa_column=Column(Integer, nullable=False, server_default=text("0"))
    )
    # The source's `ordering_key` of the message (0012): messages with one key are processed
    # one at a time, in id order. None: unordered.
    ordering_key: str | None = Field(default=None, sa_column=Column(Text))
    # Its JSON payload is indexed for search: its source's `search_payload` when it was
    # stored (0025).
    searchable: bool = Field(
        default=False,
        sa_column=Column(Boolean, nullable=False, server_default=text("false")),
    )


class AttemptRecord(InboxTable, table=True):
    """`inbox_attempts`: one row per processing attempt or admin action on a message."""

    __tablename__ = "inbox_attempts"
    __table_args__ = (
        Index("inbox_attempts_message_idx", "message_id", "id"),
        Index("inbox_attempts_started_idx", "started_at"),
        # An issue's messages, from its failed attempts (0023); attempts without one add none.
        Index(
            "inbox_attempts_fingerprint_idx",
            "fingerprint",
            postgresql_where=text("fingerprint IS NOT NULL"),
        ),
    )

    id: int | None = _identity_key()
    # No foreign key: its check per inserted row cost a tenth of PostgreSQL's CPU per
    # processed message, and every writer names a message it holds. Deleting or truncating
    # messages takes their attempts along by the statement triggers below (0007).
    message_id: int = Field(sa_column=Column(BigInteger, nullable=False))
    attempt: int = Field(sa_column=Column(Integer, nullable=False))
    started_at: datetime = Field(sa_column=Column(DateTime(timezone=True), nullable=False))
    finished_at: datetime | None = Field(default=None, sa_column=Column(DateTime(timezone=True)))
    outcome: str = Field(sa_column=Column(Text, nullable=False))
    error_type: str | None = Field(default=None, sa_column=Column(Text))
    error: str | None = Field(default=None, sa_column=Column(Text))
    traceback: str | None = Field(default=None, sa_column=Column(Text))
    duration_ms: float | None = Field(default=None, sa_column=Column(Double))
    actor: str | None = Field(default=None, sa_column=Column(Text))
    # The named destination this attempt ran (0010); None for a source without destinations,
    # and for an attempt of the whole message (one that never finished, an admin action).
    destination: str | None = Field(default=None, sa_column=Column(Text))
    # A failed attempt's cause (0022): the key of its issue (`inbox_issues`); None otherwise.
    fingerprint: str | None = Field(default=None, sa_column=Column(Text))


class DestinationRecord(InboxTable, table=True):
    """`inbox_destinations`: where a message stands with each named destination of its source
    (0010). Written by the batch that runs the destination, in the transaction that commits
    its effects, so a destination's processed mark and its effects commit together or not at
    all. No row: the destination has not run for the message (none of a source without named
    destinations has one)."""

    __tablename__ = "inbox_destinations"
    __table_args__ = (
        CheckConstraint(
            f"status IN ({sql_list(list(Status))})", name="inbox_destinations_status_check"
        ),
        # Per-destination counts and dead letters: the unfinished and dead pairs, not the
        # processed ones that are most of the table.
        Index(
            "inbox_destinations_status_idx",
            "source",
            "destination",
            "status",
            postgresql_where=text(f"status <> '{Status.PROCESSED.value}'"),
        ),
    )

    message_id: int = Field(sa_column=Column(BigInteger, primary_key=True, autoincrement=False))
    destination: str = Field(sa_column=Column(Text, primary_key=True))
    source: str = Field(sa_column=Column(Text, nullable=False))
    status: str = Field(sa_column=Column(Text, nullable=False))
    attempts: int = Field(
        default=0, sa_column=Column(Integer, nullable=False, server_default=text("0"))
    )
    last_error: str | None = Field(default=None, sa_column=Column(Text))
    updated_at: datetime | None = Field(
        default=None,
        sa_column=Column(DateTime(timezone=True), nullable=False, server_default=_now()),
    )
    processed_at: datetime | None = Field(default=None, sa_column=Column(DateTime(timezone=True)))
    # Its attempts when an operator last ran it again (0018): it is retried and dead-lettered
    # on `attempts - budget_start`, its own budget, not the message's.
    budget_start: int = Field(
        default=0, sa_column=Column(Integer, nullable=False, server_default=text("0"))
    )
    # Deferred by its rate limit: the slot of the destination's queue it holds, whose token was
    # taken when it was given (0020); it runs on it when it comes (`core.flow.slot_holds`).
    slot_at: datetime | None = Field(default=None, sa_column=Column(DateTime(timezone=True)))


class ClaimRecord(InboxTable, table=True):
    """`inbox_claims`: the attempt a worker has begun on a message whose Python handlers run in
    its batch's transaction (0008).

    The batch locks its due rows without changing them, and commits these rows from a second
    connection before any handler runs: the attempt counts even if it never finishes. The
    finish deletes them in the batch's transaction. A claim still here past `locked_until`,
    beside a message that is due and not locked, is an attempt that never finished; the next
    claim records it as abandoned. Forwards keep the message row's lease (`processing`).
    """

    __tablename__ = "inbox_claims"
    __table_args__ = CHURNING_TABLE_OPTIONS

    message_id: int = Field(sa_column=Column(BigInteger, primary_key=True, autoincrement=False))
    # `inbox_messages.attempts` + 1 when claimed: the attempt's number.
    attempt: int = Field(sa_column=Column(Integer, nullable=False))
    locked_until: datetime = Field(sa_column=Column(DateTime(timezone=True), nullable=False))
    actor: str | None = Field(default=None, sa_column=Column(Text))


class ReceiptRecord(InboxTable, table=True):
    """`inbox_receipts`: redeliveries not yet counted on their message's row (0009).

    The group commit counts a redelivery on the row itself, waiting for its lock at most
    `lock_timeout`; a batch of handlers holds its rows locked while they run, so a redelivery
    of a message being handled is written here instead, and the worker adds it to the row's
    `receive_count` and `last_received_at` once the row is free (`fold_receipts`).
    """

    __tablename__ = "inbox_receipts"
    __table_args__ = CHURNING_TABLE_OPTIONS

    id: int | None = _identity_key()
    source: str = Field(sa_column=Column(Text, nullable=False))
    message_id: str = Field(sa_column=Column(Text, nullable=False))
    received: int = Field(sa_column=Column(Integer, nullable=False))
    received_at: datetime = Field(
        sa_column=Column(DateTime(timezone=True), nullable=False, server_default=text("now()"))
    )


class SourcePause(InboxTable, table=True):
    """`inbox_source_pauses`: the sources whose processing an operator has paused, who did
    and why (0011). Ingest goes on accepting their deliveries; no worker claims them."""

    __tablename__ = "inbox_source_pauses"

    source: str = Field(sa_column=Column(Text, primary_key=True))
    paused_at: datetime | None = Field(
        default=None,
        sa_column=Column(DateTime(timezone=True), nullable=False, server_default=_now()),
    )
    operator: str = Field(sa_column=Column(Text, nullable=False))
    reason: str = Field(sa_column=Column(Text, nullable=False))
    actor: str | None = Field(default=None, sa_column=Column(Text))


class ConsumerRecord(InboxTable, table=True):
    """`inbox_consumers`: each broker consumer process's state, by source (0021), written by
    the consumer every 5 s and on each change and deleted on its clean stop; a row not updated
    for a while is a consumer that died (`store.consumers`)."""

    __tablename__ = "inbox_consumers"

    source: str = Field(sa_column=Column(Text, primary_key=True))
    # The process: `hostname:pid`.
    consumer: str = Field(sa_column=Column(Text, primary_key=True))
    connected: bool = Field(sa_column=Column(Boolean, nullable=False))
    state: str = Field(sa_column=Column(Text, nullable=False))
    last_error: str | None = Field(default=None, sa_column=Column(Text))
    lag: int | None = Field(default=None, sa_column=Column(BigInteger))
    # Messages settled, by outcome (accepted, duplicate, dead_lettered, released, ack_lost).
    counts: dict[str, int] = Field(sa_column=Column(JSONB, nullable=False))
    started_at: datetime | None = Field(
        default=None,
        sa_column=Column(DateTime(timezone=True), nullable=False, server_default=_now()),
    )
    updated_at: datetime | None = Field(
        default=None,
        sa_column=Column(DateTime(timezone=True), nullable=False, server_default=_now()),
    )


class RejectedDelivery(InboxTable, table=True):
    """`inbox_rejected_deliveries`: deliveries ingest answered with a 4xx, kept a short while
    for the operator (0017): never a body or a credential, at most the newest
    `INBOX_REJECTED_PER_SOURCE` a source and none older than a day (`store.rejections`)."""

    __tablename__ = "inbox_rejected_deliveries"
    __table_args__ = (
        # The listing (newest first, by source) and the bound (a source's newest N).
        Index("inbox_rejected_deliveries_source_idx", "source", text("id DESC")),
    )

    id: int | None = _identity_key()
    source: str = Field(sa_column=Column(Text, nullable=False))
    received_at: datetime = Field(sa_column=Column(DateTime(timezone=True), nullable=False))
    status: int = Field(sa_column=Column(SmallInteger, nullable=False))
    reason: str = Field(sa_column=Column(Text, nullable=False))
    detail: str = Field(sa_column=Column(Text, nullable=False))
    size: int = Field(sa_column=Column(BigInteger, nullable=False))
    headers: dict[str, str] = Field(sa_column=Column(JSONB, nullable=False))
    request_id: str | None = Field(default=None, sa_column=Column(Text))


class RateBucket(InboxTable, table=True):
    """`inbox_rate_limits`: each rate-limited source's token bucket, shared by every process
    on the database (0013): a claim takes tokens, one a message, refilled at the source's rate
    up to its burst; and a named destination's queue, the last slot given to a run deferred
    for want of a token (0020)."""

    __tablename__ = "inbox_rate_limits"
    __table_args__ = CHURNING_TABLE_OPTIONS

    source: str = Field(sa_column=Column(Text, primary_key=True))
    tokens: float = Field(sa_column=Column(Double, nullable=False))
    refilled_at: datetime | None = Field(
        default=None,
        sa_column=Column(DateTime(timezone=True), nullable=False, server_default=_now()),
    )
    queued_until: datetime | None = Field(
        default=None, sa_column=Column(DateTime(timezone=True), nullable=True)
    )


class Breaker(InboxTable, table=True):
    """`inbox_breakers`: the circuit breaker of each source's forward, shared by every process
    (0014). `open_until` set: open (no claim) until then, then one probe (`probing_until`, its
    lease) decides."""

    __tablename__ = "inbox_breakers"
    __table_args__ = CHURNING_TABLE_OPTIONS

    source: str = Field(sa_column=Column(Text, primary_key=True))
    failures: int = Field(
        default=0, sa_column=Column(Integer, nullable=False, server_default=text("0"))
    )
    open_until: datetime | None = Field(default=None, sa_column=Column(DateTime(timezone=True)))
    probing_until: datetime | None = Field(default=None, sa_column=Column(DateTime(timezone=True)))
    opened_at: datetime | None = Field(default=None, sa_column=Column(DateTime(timezone=True)))
    last_error: str | None = Field(default=None, sa_column=Column(Text))
    # Calls the claims in flight may make, of the failures left before it opens, until
    # `reserved_until` (their lease: a crashed worker's reservation lapses).
    reserved: int = Field(
        default=0, sa_column=Column(Integer, nullable=False, server_default=text("0"))
    )
    reserved_until: datetime | None = Field(default=None, sa_column=Column(DateTime(timezone=True)))


class IssueRecord(InboxTable, table=True):
    """`inbox_issues`: the failures of one cause, one row per fingerprint (0022), counted in
    the transaction that records the failed attempts (`store.attempts`). Its messages are those
    whose latest failed attempt has its fingerprint (`inbox_attempts.fingerprint`)."""

    __tablename__ = "inbox_issues"
    __table_args__ = (
        CheckConstraint(
            f"status IN ({sql_list(list(IssueStatus))})", name="inbox_issues_status_check"
        ),
    )

    # The first 16 hex of the sha256 of the parts below (`processing.fingerprints`).
    fingerprint: str = Field(sa_column=Column(Text, primary_key=True))
    source: str = Field(sa_column=Column(Text, nullable=False))
    destination: str | None = Field(default=None, sa_column=Column(Text))
    # The handler that raised, `module:function`.
    handler: str | None = Field(default=None, sa_column=Column(Text))
    error_type: str = Field(sa_column=Column(Text, nullable=False))
    # The innermost frame of the application's own code, `module:function` (no line).
    frame: str | None = Field(default=None, sa_column=Column(Text))
    # A forward's status class or connection error kind, and its endpoint.
    detail: str | None = Field(default=None, sa_column=Column(Text))
    status: str = Field(sa_column=Column(Text, nullable=False))
    acknowledged_by: str | None = Field(default=None, sa_column=Column(Text))
    note: str | None = Field(default=None, sa_column=Column(Text))
    first_seen: datetime = Field(sa_column=Column(DateTime(timezone=True), nullable=False))
    last_seen: datetime = Field(sa_column=Column(DateTime(timezone=True), nullable=False))
    failed_attempts: int = Field(sa_column=Column(BigInteger, nullable=False))
    sample_error: str | None = Field(default=None, sa_column=Column(Text))
    sample_traceback: str | None = Field(default=None, sa_column=Column(Text))
    # When it last failed again after being resolved.
    reopened_at: datetime | None = Field(default=None, sa_column=Column(DateTime(timezone=True)))


class AlertWatermark(InboxTable, table=True):
    """`inbox_alert_watermarks`: per alert target and source, the last dead-letter attempt
    notified and when (0004)."""

    __tablename__ = "inbox_alert_watermarks"

    target: str = Field(sa_column=Column(Text, primary_key=True))
    source: str = Field(sa_column=Column(Text, primary_key=True))
    last_attempt_id: int = Field(sa_column=Column(BigInteger, nullable=False))
    notified_at: datetime | None = Field(default=None, sa_column=Column(DateTime(timezone=True)))


class IssueNoticeRecord(InboxTable, table=True):
    """`inbox_issue_notices`: per alert target and issue, the opening (`first_seen` or
    `reopened_at`) its notice tells of, when a pass claimed it and when it was delivered (0024).
    A later opening replaces the row: its notice is due again."""

    __tablename__ = "inbox_issue_notices"

    target: str = Field(sa_column=Column(Text, primary_key=True))
    fingerprint: str = Field(sa_column=Column(Text, primary_key=True))
    opened_at: datetime = Field(sa_column=Column(DateTime(timezone=True), nullable=False))
    claimed_at: datetime | None = Field(default=None, sa_column=Column(DateTime(timezone=True)))
    sent_at: datetime | None = Field(default=None, sa_column=Column(DateTime(timezone=True)))


class BulkActionRecord(InboxTable, table=True):
    """`inbox_bulk_actions`: the admin audit of bulk actions (0026), one row per action with
    the query it ran, and its walk's progress, which each batch updates in the transaction
    that changes its messages (`store.bulk`): progress never runs ahead of what committed, so
    a resumed walk starts exactly after the last batch that did."""

    __tablename__ = "inbox_bulk_actions"
    __table_args__ = (
        CheckConstraint(
            f"action IN ({sql_list(list(BulkAction))})", name="inbox_bulk_actions_action_check"
        ),
        CheckConstraint(
            f"status IN ({sql_list(list(BulkActionStatus))})",
            name="inbox_bulk_actions_status_check",
        ),
    )

    id: int | None = _identity_key()
    action: str = Field(sa_column=Column(Text, nullable=False))
    # The named destination of a `replay_destination`.
    destination: str | None = Field(default=None, sa_column=Column(Text))
    # The filters as the operator gave them (the admin API's request, without `dry_run`).
    query: dict[str, Any] = Field(sa_column=Column(JSONB, nullable=False))
    actor: str = Field(sa_column=Column(Text, nullable=False))
    status: str = Field(sa_column=Column(Text, nullable=False))
    matched: int = Field(sa_column=Column(BigInteger, nullable=False))
    # Messages changed so far.
    done: int = Field(sa_column=Column(BigInteger, nullable=False, server_default=text("0")))
    # The walk's position: the next batch picks ids above it.
    after_id: int = Field(sa_column=Column(BigInteger, nullable=False, server_default=text("0")))
    # The highest id matched when the action began: the walk's bound (null: none matched).
    last_id: int | None = Field(default=None, sa_column=Column(BigInteger))
    created_at: datetime | None = Field(
        default=None,
        sa_column=Column(DateTime(timezone=True), nullable=False, server_default=_now()),
    )
    # The runner's heartbeat: touched by each batch.
    updated_at: datetime | None = Field(
        default=None,
        sa_column=Column(DateTime(timezone=True), nullable=False, server_default=_now()),
    )
    finished_at: datetime | None = Field(default=None, sa_column=Column(DateTime(timezone=True)))


# What the foreign key's ON DELETE CASCADE did, per statement instead of per row: a DELETE of
# messages (retention's batches) deletes their attempts in one statement, a TRUNCATE deletes
# all attempts (a DELETE: a TRUNCATE naming both tables still holds the attempts open) (0007).
ATTEMPTS_FOLLOW_MESSAGES = (
    "CREATE FUNCTION inbox_attempts_follow_deleted() RETURNS trigger LANGUAGE plpgsql AS "
    "$$BEGIN DELETE FROM inbox_attempts AS a USING deleted WHERE a.message_id = deleted.id; "
    "RETURN NULL; END$$",
    "CREATE TRIGGER inbox_messages_deleted AFTER DELETE ON inbox_messages "
    "REFERENCING OLD TABLE AS deleted "
    "FOR EACH STATEMENT EXECUTE FUNCTION inbox_attempts_follow_deleted()",
    "CREATE FUNCTION inbox_attempts_follow_truncated() RETURNS trigger LANGUAGE plpgsql AS "
    "$$BEGIN DELETE FROM inbox_attempts; RETURN NULL; END$$",
    "CREATE TRIGGER inbox_messages_truncated AFTER TRUNCATE ON inbox_messages "
    "FOR EACH STATEMENT EXECUTE FUNCTION inbox_attempts_follow_truncated()",
)

# Claims go with their message the same way (0008).
CLAIMS_FOLLOW_MESSAGES = (
    "CREATE FUNCTION inbox_claims_follow_deleted() RETURNS trigger LANGUAGE plpgsql AS "
    "$$BEGIN DELETE FROM inbox_claims AS c USING deleted WHERE c.message_id = deleted.id; "
    "RETURN NULL; END$$",
    "CREATE TRIGGER inbox_messages_deleted_claims AFTER DELETE ON inbox_messages "
    "REFERENCING OLD TABLE AS deleted "
    "FOR EACH STATEMENT EXECUTE FUNCTION inbox_claims_follow_deleted()",
    "CREATE FUNCTION inbox_claims_follow_truncated() RETURNS trigger LANGUAGE plpgsql AS "
    "$$BEGIN DELETE FROM inbox_claims; RETURN NULL; END$$",
    "CREATE TRIGGER inbox_messages_truncated_claims AFTER TRUNCATE ON inbox_messages "
    "FOR EACH STATEMENT EXECUTE FUNCTION inbox_claims_follow_truncated()",
)

# Receipts go with their message the same way (0009), by its key: a receipt is written
# where a batch met the key stored, and names no row id.
RECEIPTS_FOLLOW_MESSAGES = (
    "CREATE FUNCTION inbox_receipts_follow_deleted() RETURNS trigger LANGUAGE plpgsql AS "
    "$$BEGIN DELETE FROM inbox_receipts AS r USING deleted "
    "WHERE r.source = deleted.source AND r.message_id = deleted.message_id; "
    "RETURN NULL; END$$",
    "CREATE TRIGGER inbox_messages_deleted_receipts AFTER DELETE ON inbox_messages "
    "REFERENCING OLD TABLE AS deleted "
    "FOR EACH STATEMENT EXECUTE FUNCTION inbox_receipts_follow_deleted()",
    "CREATE FUNCTION inbox_receipts_follow_truncated() RETURNS trigger LANGUAGE plpgsql AS "
    "$$BEGIN DELETE FROM inbox_receipts; RETURN NULL; END$$",
    "CREATE TRIGGER inbox_messages_truncated_receipts AFTER TRUNCATE ON inbox_messages "
    "FOR EACH STATEMENT EXECUTE FUNCTION inbox_receipts_follow_truncated()",
)

# Destination rows go with their message the same way (0010).
DESTINATIONS_FOLLOW_MESSAGES = (
    "CREATE FUNCTION inbox_destinations_follow_deleted() RETURNS trigger LANGUAGE plpgsql AS "
    "$$BEGIN DELETE FROM inbox_destinations AS d USING deleted "
    "WHERE d.message_id = deleted.id; RETURN NULL; END$$",
    "CREATE TRIGGER inbox_messages_deleted_destinations AFTER DELETE ON inbox_messages "
    "REFERENCING OLD TABLE AS deleted "
    "FOR EACH STATEMENT EXECUTE FUNCTION inbox_destinations_follow_deleted()",
    "CREATE FUNCTION inbox_destinations_follow_truncated() RETURNS trigger LANGUAGE plpgsql AS "
    "$$BEGIN DELETE FROM inbox_destinations; RETURN NULL; END$$",
    "CREATE TRIGGER inbox_messages_truncated_destinations AFTER TRUNCATE ON inbox_messages "
    "FOR EACH STATEMENT EXECUTE FUNCTION inbox_destinations_follow_truncated()",
)

# The body as jsonb for the search index, NULL when it is not UTF-8 JSON or is over 256 KiB
# (0025, which says why it is written so).
PAYLOAD_FUNCTION = (
    "CREATE OR REPLACE FUNCTION inbox_payload(body bytea) RETURNS jsonb "
    "LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL UNSAFE AS "
    "$$BEGIN IF octet_length(body) > 262144 THEN RETURN NULL; END IF; "
    "RETURN convert_from(body, 'UTF8')::jsonb; "
    "EXCEPTION WHEN OTHERS THEN RETURN NULL; END$$"
)

metadata = InboxTable.metadata


# The triggers by which each table's rows go with their message, created with the table.
FOLLOW_MESSAGES = {
    "inbox_attempts": ATTEMPTS_FOLLOW_MESSAGES,
    "inbox_claims": CLAIMS_FOLLOW_MESSAGES,
    "inbox_receipts": RECEIPTS_FOLLOW_MESSAGES,
    "inbox_destinations": DESTINATIONS_FOLLOW_MESSAGES,
}


def _follow_messages(target: Table, connection: Connection, **kw: Any) -> None:
    for statement in FOLLOW_MESSAGES[target.name]:
        connection.exec_driver_sql(statement)


for _name in FOLLOW_MESSAGES:
    event.listen(metadata.tables[_name], "after_create", _follow_messages)


def _payload_function(target: Table, connection: Connection, **kw: Any) -> None:
    connection.exec_driver_sql(PAYLOAD_FUNCTION)


# Before the table, whose payload index calls it.
event.listen(metadata.tables["inbox_messages"], "before_create", _payload_function)
