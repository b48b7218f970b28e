"""`/admin/issues`: failures grouped by cause, one issue per fingerprint, most recently failing
first, and the operator's decisions on one (docs/operating.md#issues-failures-grouped-by-cause)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated

from fastapi import APIRouter, Body, Path, Query

from service.api.admin.models import (
    FINGERPRINT_PATTERN,
    BulkRetryResult,
    IssueAction,
    IssueDetail,
    IssueDetailQuery,
    IssueList,
    IssueQuery,
    IssueRetryRequest,
    IssueSummary,
    MessageSummary,
)
from service.api.problems import ProblemError, problem_responses
from service.api.security import AdminDep
from service.api.state import StateDep
from service.core import tracing
from service.core.status import IssueStatus
from service.store import issues as store

log = logging.getLogger("service.admin")

router = APIRouter(tags=["admin: operations"])

FingerprintPath = Annotated[
    str,
    Path(
        pattern=FINGERPRINT_PATTERN,
        description="The issue's fingerprint: 16 lowercase hex characters.",
    ),
]

# Each decision's path, and the status it sets.
DECISIONS = {
    "acknowledge": IssueStatus.ACKNOWLEDGED,
    "resolve": IssueStatus.RESOLVED,
    "ignore": IssueStatus.IGNORED,
    "reopen": IssueStatus.OPEN,
}


@contextmanager
def known_issue() -> Iterator[None]:
    """An unknown fingerprint as a 404 problem."""
    try:
        yield
    except store.IssueNotFound as exc:
        raise ProblemError(404, f"no issue with fingerprint {exc.args[0]}") from None


def issue_detail(row: dict[str, object]) -> IssueDetail:
    messages = row["messages"]
    assert isinstance(messages, list)
    return IssueDetail.model_validate(
        {**row, "messages": [MessageSummary.from_row(m) for m in messages]}
    )


@router.get("/issues", response_model=IssueList)
async def issues(state: StateDep, query: Annotated[IssueQuery, Query()]) -> IssueList:
    """List failures grouped by cause, most recent first, with their messages now retrying and
    dead."""
    rows = await store.list_issues(state.engine, query.source, query.status, query.limit)
    return IssueList(items=[IssueSummary.model_validate(row) for row in rows])


@router.get("/issues/{fingerprint}", response_model=IssueDetail, responses=problem_responses(404))
async def issue(
    state: StateDep, fingerprint: FingerprintPath, query: Annotated[IssueDetailQuery, Query()]
) -> IssueDetail:
    """Show one issue and its messages, newest first."""
    with known_issue():
        row = await store.get_issue(state.engine, fingerprint, query.limit)
    return issue_detail(row)


async def decide(
    state: StateDep, admin: AdminDep, fingerprint: str, decision: str, request: IssueAction
) -> IssueSummary:
    """Set the issue's status for `decision`, and log who did it."""
    with tracing.admin_span(f"issue_{decision}", fingerprint=fingerprint), known_issue():
        row = await store.set_issue_status(
            state.engine, fingerprint, DECISIONS[decision], request.operator, request.note
        )
    state.metrics.admin_actions.labels(f"issue_{decision}").inc()
    log.info(
        f"issue {decision}",
        extra={
            "fingerprint": fingerprint,
            "source": row["source"],
            "operator": request.operator,
            "note": request.note,
            "actor": admin.actor,
        },
    )
    return IssueSummary.model_validate(row)


@router.post(
    "/issues/{fingerprint}/acknowledge",
    response_model=IssueSummary,
    responses=problem_responses(404),
)
async def acknowledge_issue(
    state: StateDep,
    admin: AdminDep,
    fingerprint: FingerprintPath,
    request: Annotated[IssueAction, Body()],
) -> IssueSummary:
    """Acknowledge an issue: someone is on it. It stays acknowledged when it fails again."""
    return await decide(state, admin, fingerprint, "acknowledge", request)


@router.post(
    "/issues/{fingerprint}/resolve", response_model=IssueSummary, responses=problem_responses(404)
)
async def resolve_issue(
    state: StateDep,
    admin: AdminDep,
    fingerprint: FingerprintPath,
    request: Annotated[IssueAction, Body()],
) -> IssueSummary:
    """Resolve an issue: its cause is fixed. It opens again when it fails again."""
    return await decide(state, admin, fingerprint, "resolve", request)


@router.post(
    "/issues/{fingerprint}/ignore", response_model=IssueSummary, responses=problem_responses(404)
)
async def ignore_issue(
    state: StateDep,
    admin: AdminDep,
    fingerprint: FingerprintPath,
    request: Annotated[IssueAction, Body()],
) -> IssueSummary:
    """Ignore an issue: its failures are expected. It stays ignored when it fails again."""
    return await decide(state, admin, fingerprint, "ignore", request)


@router.post(
    "/issues/{fingerprint}/reopen", response_model=IssueSummary, responses=problem_responses(404)
)
async def reopen_issue(
    state: StateDep,
    admin: AdminDep,
    fingerprint: FingerprintPath,
    request: Annotated[IssueAction, Body()],
) -> IssueSummary:
    """Open an acknowledged, resolved or ignored issue again."""
    return await decide(state, admin, fingerprint, "reopen", request)


@router.post(
    "/issues/{fingerprint}/retry", response_model=BulkRetryResult, responses=problem_responses(404)
)
async def retry_issue(
    state: StateDep,
    admin: AdminDep,
    fingerprint: FingerprintPath,
    request: Annotated[IssueRetryRequest, Body()],
) -> BulkRetryResult:
    """Resolve an issue and retry its dead messages with a fresh budget; `dry_run` only counts
    them."""
    with (
        tracing.admin_span("issue_retry", fingerprint=fingerprint, dry_run=request.dry_run),
        known_issue(),
    ):
        result = await store.resolve_and_retry(
            state.engine, fingerprint, request.operator, admin.actor, dry_run=request.dry_run
        )
    for action, count in result.by_action.items():
        state.metrics.admin_actions.labels(action).inc(count)
    log.info(
        "issue retry",
        extra={
            "fingerprint": fingerprint,
            "operator": request.operator,
            "actor": admin.actor,
            "dry_run": request.dry_run,
            "matched": result.matched,
            "retried": result.retried,
        },
    )
    return BulkRetryResult(matched=result.matched, retried=result.retried)
