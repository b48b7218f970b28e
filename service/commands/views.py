"""How the admin API's documents read as text for people: tables, a message's detail."""

from __future__ import annotations

import json
from typing import Any

from service.api.admin.models import (
    DeadLetterGroups,
    DestinationStatsList,
    EndpointList,
    IssueDetail,
    IssueSummary,
    MessageDetail,
    MessageSummary,
    Stats,
)
from service.api.admin.rejections import RejectedDelivery
from service.commands.output import age, table
from service.core.schema import Status


def summary_table(items: list[MessageSummary]) -> str:
    if not items:
        return "no messages match"
    return table(
        ["ID", "SOURCE", "MESSAGE ID", "EVENT TYPE", "STATUS", "ATTEMPTS", "RECEIVED", "ERROR"],
        [
            [
                m.id,
                m.source,
                m.message_id,
                m.event_type,
                m.status_text(),
                m.attempts_text(),
                m.received_at,
                m.last_error,
            ]
            for m in items
        ],
    )


def describe_detail(detail: MessageDetail) -> str:
    fields = [
        ("id", detail.id),
        ("source", detail.source),
        ("message id", detail.message_id),
        ("event type", detail.event_type),
        ("status", detail.status.value),
        ("attempts", detail.attempts_text()),
        ("received", f"{detail.received_at.isoformat()} ({detail.receive_count} deliveries)"),
        ("next attempt", detail.next_attempt_at.isoformat() if detail.next_attempt_at else None),
        ("processed", detail.processed_at.isoformat() if detail.processed_at else None),
        ("last error", detail.last_error),
        ("ordering key", detail.ordering_key),
        ("held behind", None if detail.held_behind is None else f"message {detail.held_behind}"),
        ("content type", detail.content_type),
    ]
    lines = [f"{name + ':':<14}{'-' if value is None else value}" for name, value in fields]
    lines.append("headers:")
    lines += [f"  {name}: {value}" for name, value in detail.headers.items()]
    if detail.body_base64 is not None:
        lines.append(f"body (base64): {detail.body_base64}")
    else:
        lines.append("payload:")
        lines += ["  " + line for line in json.dumps(detail.payload, indent=2).splitlines()]
    if detail.destinations:
        lines.append("destinations:")
        pairs = table(
            ["NAME", "STATUS", "ATTEMPTS", "UPDATED", "LAST ERROR"],
            [
                [d.name, d.status.value, d.attempts_text(), d.updated_at, d.last_error]
                for d in detail.destinations
            ],
        )
        lines += ["  " + line for line in pairs.splitlines()]
    lines.append("history:")
    if detail.attempts:
        named = any(a.destination for a in detail.attempts)
        history = table(
            [
                "#",
                *(["DESTINATION"] if named else []),
                "STARTED",
                "OUTCOME",
                "ERROR",
                "MS",
                "ACTOR",
            ],
            [
                [
                    a.attempt,
                    *([a.destination] if named else []),
                    a.started_at,
                    a.outcome,
                    a.error,
                    a.duration_ms,
                    a.actor,
                ]
                for a in detail.attempts
            ],
        )
        lines += ["  " + line for line in history.splitlines()]
    else:
        lines.append("  (no attempts yet)")
    return "\n".join(lines)


def destinations_table(document: DestinationStatsList) -> str:
    if not document.destinations:
        return "no source names destinations"
    statuses = [s.value for s in Status if s != Status.PROCESSING]
    return table(
        ["SOURCE", "DESTINATION", *(s.upper() for s in statuses), "TOTAL"],
        [
            [d.source, d.destination, *(d.counts.get(st, 0) for st in statuses), d.total]
            for d in document.destinations
        ],
    )


def endpoints_table(document: EndpointList) -> str:
    if not document.endpoints:
        return "no endpoint is configured ([endpoints.NAME] in the sources file)"
    statuses = [s.value for s in Status if s != Status.PROCESSING]
    return table(
        ["ENDPOINT", *(s.upper() for s in statuses), "OLDEST UNSENT", "BREAKER", "PAUSED"],
        [
            [
                e.name,
                *(e.counts.get(st, 0) for st in statuses),
                age(e.oldest_pending_age_seconds),
                e.breaker.state if e.breaker else "closed",
                "yes" if e.paused else "",
            ]
            for e in document.endpoints
        ],
    )


def groups_table(document: DeadLetterGroups) -> str:
    return table(
        ["ERROR TYPE", "COUNT", "SOURCES", "OLDEST", "NEWEST", "LATEST ERROR"],
        [
            [
                g.error_type,
                g.count,
                ",".join(g.sources),
                g.oldest_received_at,
                g.newest_received_at,
                g.latest_error,
            ]
            for g in document.groups
        ],
    )


def stats_table(stats: Stats) -> str:
    statuses = [s.value for s in Status]
    rows: list[list[Any]] = [
        [
            s.source,
            *(s.counts.get(st, 0) for st in statuses),
            s.total,
            age(s.oldest_pending_age_seconds),
        ]
        for s in stats.sources
    ]
    rows.append(
        [
            "(all)",
            *(stats.by_status.get(st, 0) for st in statuses),
            stats.total,
            age(stats.oldest_pending_age_seconds),
        ]
    )
    counts = table(["SOURCE", *(s.upper() for s in statuses), "TOTAL", "OLDEST UNFINISHED"], rows)
    return (
        f"{counts}\nlast hour: {stats.attempts_last_hour} attempts, "
        f"{stats.failures_last_hour} failed, {stats.admin_actions_last_hour} admin actions"
    )


def rejected_table(items: list[RejectedDelivery], *, headers: bool) -> str:
    """Refused deliveries, one a row; `headers`: each followed by its (redacted) headers."""
    if not items:
        return "no refused deliveries in the last day"
    columns = ["ID", "SOURCE", "RECEIVED", "STATUS", "REASON", "SIZE", "DETAIL"]
    rows = [[r.id, r.source, r.received_at, r.status, r.reason, r.size, r.detail] for r in items]
    if not headers:
        return table(columns, rows)
    blocks = []
    for item, row in zip(items, rows, strict=True):
        lines = [table(columns, [row])]
        lines += [f"  {name}: {value}" for name, value in item.headers.items()]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def issues_table(items: list[IssueSummary]) -> str:
    if not items:
        return "no issues match"
    return table(
        ["FINGERPRINT", "SOURCE", "STATUS", "CAUSE", "FAILED", "RETRYING", "DEAD", "LAST SEEN"],
        [
            [
                i.fingerprint,
                i.source if i.destination is None else f"{i.source}/{i.destination}",
                i.status.value,
                cause(i),
                i.failed_attempts,
                i.retrying,
                i.dead,
                i.last_seen,
            ]
            for i in items
        ],
    )


def cause(issue: IssueSummary) -> str:
    """`ValueError in tests.handlers:always_fail`, `ForwardFailed 5xx host:port/path`."""
    where = issue.frame or issue.handler
    return " ".join(
        part for part in (issue.error_type, where and f"in {where}", issue.detail) if part
    )


def describe_issue(issue: IssueDetail) -> str:
    fields = [
        ("fingerprint", issue.fingerprint),
        ("source", issue.source),
        ("destination", issue.destination),
        ("handler", issue.handler),
        ("cause", cause(issue)),
        ("status", issue.status.value),
        ("decided by", issue.acknowledged_by),
        ("note", issue.note),
        ("first seen", issue.first_seen.isoformat()),
        ("last seen", issue.last_seen.isoformat()),
        ("reopened", issue.reopened_at.isoformat() if issue.reopened_at else None),
        (
            "failed",
            f"{issue.failed_attempts} attempts; {issue.retrying} retrying, {issue.dead} dead",
        ),
        ("last error", issue.sample_error),
    ]
    lines = [f"{name + ':':<13}{'-' if value is None else value}" for name, value in fields]
    if issue.sample_traceback:
        lines += ["traceback:", *(f"  {line}" for line in issue.sample_traceback.splitlines())]
    lines += ["messages:", summary_table(issue.messages)]
    return "\n".join(lines)
