"""The console's Issues: failures grouped by cause (`/admin/issues`) for people, each issue's
page, and the decisions on one, each taken through the admin API's route functions."""

from __future__ import annotations

import re

from fastapi import APIRouter, Request
from pydantic import ValidationError
from starlette.responses import RedirectResponse, Response

from service.api.admin import issues as issues_api
from service.api.admin.models import (
    FINGERPRINT_PATTERN,
    IssueAction,
    IssueDetail,
    IssueDetailQuery,
    IssueQuery,
    IssueRetryRequest,
    IssueSummary,
)
from service.api.console import views
from service.api.console.access import ActionDep, ConsoleError, Form, Operator, OperatorDep
from service.api.console.pages import source_names
from service.api.problems import ProblemError
from service.api.state import AppState, StateDep
from service.core.status import IssueStatus

router = APIRouter()

ISSUES_LISTED = 500  # the admin API's most
# Still waiting for someone: listed before the resolved and ignored ones.
UNSETTLED = frozenset({IssueStatus.OPEN, IssueStatus.ACKNOWLEDGED})

# What a decision did (`?done=` after the redirect).
NOTICES = {
    "acknowledge": "Acknowledged: it stays acknowledged when it fails again.",
    "resolve": "Resolved: it opens again if it fails again.",
    "ignore": "Ignored: its failures are expected; it stays ignored when it fails again.",
    "reopen": "Opened again.",
}


def fingerprint_of(text: str) -> str:
    if re.fullmatch(FINGERPRINT_PATTERN, text):
        return text
    raise ConsoleError(404, "No such issue", "an issue's fingerprint is 16 lowercase hex")


@router.get("/issues")
async def issues(request: Request, state: StateDep, operator: OperatorDep) -> Response:
    """Failures grouped by cause: open and acknowledged first, then resolved and ignored, each
    most recently failing first; filtered by status and source as the URL says."""
    items = views.query_items(request.query_params.multi_items(), ("source", "status"))
    query, problems = views.parse_query(IssueQuery, [*items, ("limit", str(ISSUES_LISTED))])
    listed: list[IssueSummary] = []
    if query is not None:
        listed = (await issues_api.issues(state, query)).items
    # A stable sort keeps each group's most recent first.
    listed.sort(key=lambda issue: issue.status not in UNSETTLED)
    form = dict(items)
    return operator.page(
        "issues.html",
        title="Issues",
        nav="issues",
        issues=listed,
        problems=problems,
        form=form,
        chosen_statuses={v for k, v in items if k == "status"},
        statuses=list(IssueStatus),
        sources=await source_names(state),
    )


async def load_issue(state: AppState, text: str) -> IssueDetail:
    try:
        return await issues_api.issue(state, fingerprint_of(text), IssueDetailQuery())
    except ProblemError as exc:
        raise ConsoleError(exc.status, "No such issue", exc.detail) from None


@router.get("/issues/{fingerprint}")
async def issue(
    fingerprint: str, state: StateDep, operator: OperatorDep, done: str | None = None
) -> Response:
    """One issue: its parts, its status and who set it, its sample error and traceback, its
    messages, and the decisions on it."""
    detail = await load_issue(state, fingerprint)
    return operator.page(
        "issue.html",
        title=f"Issue {detail.fingerprint}",
        nav="issues",
        issue=detail,
        notice=NOTICES.get(done or ""),
    )


@router.get("/issues/{fingerprint}/retry")
async def confirm_retry(fingerprint: str, state: StateDep, operator: OperatorDep) -> Response:
    """Count the issue's dead messages (the API's dry run), and ask before resolving it and
    retrying them."""
    detail = await load_issue(state, fingerprint)
    counted = await issues_api.retry_issue(
        state, operator.admin, detail.fingerprint, IssueRetryRequest(dry_run=True)
    )
    return operator.page(
        "issue_retry.html",
        title=f"Resolve and retry issue {detail.fingerprint}",
        nav="issues",
        issue=detail,
        matched=counted.matched,
    )


def decision_request(form: dict[str, str], title: str) -> IssueAction:
    try:
        return IssueAction(operator=form.get("operator") or "", note=form.get("note") or None)
    except ValidationError:
        raise ConsoleError(
            422, title, "give your name, and a note if any (each 1 to 512 characters)"
        ) from None


async def decide(operator: Operator, state: AppState, text: str, form: Form, name: str) -> Response:
    fingerprint = fingerprint_of(text)
    title = f"Could not {name} issue {fingerprint}"
    request = decision_request(dict(form.fields), title)
    try:
        await issues_api.decide(state, operator.admin, fingerprint, name, request)
    except ProblemError as exc:
        raise ConsoleError(exc.status, title, exc.detail) from None
    return RedirectResponse(f"/console/issues/{fingerprint}?done={name}", status_code=303)


@router.post("/issues/{fingerprint}/acknowledge")
async def acknowledge(fingerprint: str, state: StateDep, action: ActionDep) -> Response:
    """Acknowledge an issue, with your name and a note."""
    return await decide(action[0], state, fingerprint, action[1], "acknowledge")


@router.post("/issues/{fingerprint}/resolve")
async def resolve(fingerprint: str, state: StateDep, action: ActionDep) -> Response:
    """Resolve an issue: its cause is fixed."""
    return await decide(action[0], state, fingerprint, action[1], "resolve")


@router.post("/issues/{fingerprint}/ignore")
async def ignore(fingerprint: str, state: StateDep, action: ActionDep) -> Response:
    """Ignore an issue: its failures are expected."""
    return await decide(action[0], state, fingerprint, action[1], "ignore")


@router.post("/issues/{fingerprint}/reopen")
async def reopen(fingerprint: str, state: StateDep, action: ActionDep) -> Response:
    """Open an issue again."""
    return await decide(action[0], state, fingerprint, action[1], "reopen")


@router.post("/issues/{fingerprint}/retry")
async def retry(fingerprint: str, state: StateDep, action: ActionDep) -> Response:
    """Resolve the issue and retry its dead messages (asked for on the confirmation page)."""
    operator, form = action
    checked = fingerprint_of(fingerprint)
    try:
        request = IssueRetryRequest(operator=form.get("operator") or None)
    except ValidationError:
        raise ConsoleError(422, "Could not retry", "a name is 1 to 512 characters") from None
    try:
        result = await issues_api.retry_issue(state, operator.admin, checked, request)
    except ProblemError as exc:
        raise ConsoleError(exc.status, f"Could not retry issue {checked}", exc.detail) from None
    return operator.page(
        "bulk_done.html",
        title="Issue resolved, messages retried",
        nav="issues",
        matched=result.matched,
        retried=result.retried,
        list_url=f"/console/issues/{checked}",
        back_label="Back to the issue",
    )
