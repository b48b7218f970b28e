"""Signing in to the console with an admin token, and signing out."""

from __future__ import annotations

import logging
import time

from fastapi import APIRouter, Request
from starlette.responses import RedirectResponse, Response

from service.api.console.access import (
    SIGN_IN_PATH,
    ConsoleError,
    clear_session_cookie,
    current_session,
    key_for,
    read_form,
    safe_next,
    set_session_cookie,
)
from service.api.console.session import Session, csrf_matches, csrf_token, new_session
from service.api.console.templating import page
from service.api.security import matching_token, token_fingerprint
from service.api.state import AppState, StateDep

log = logging.getLogger("service.console")

router = APIRouter()


def sign_in_page(
    request: Request,
    state: AppState,
    session: Session,
    next_path: str,
    *,
    error: str | None = None,
    notice: str | None = None,
    status_code: int = 200,
) -> Response:
    response = page(
        "sign_in.html",
        title="Sign in",
        csrf=None,
        form_token=csrf_token(key_for(state), session),
        next_path=next_path,
        error=error,
        notice=notice,
        status_code=status_code,
    )
    set_session_cookie(response, request, state, session)
    return response


@router.get("/sign-in")
async def sign_in_form(
    request: Request, state: StateDep, next: str | None = None, signed_out: str | None = None
) -> Response:
    """The sign-in form: one field, an admin token."""
    session = current_session(request, state)
    if session is not None and session.signed_in:
        return RedirectResponse(safe_next(next), status_code=303)
    if session is None:
        session = new_session(None, time.time())
    notice = "You have signed out." if signed_out else None
    return sign_in_page(request, state, session, safe_next(next), notice=notice)


@router.post("/sign-in")
async def sign_in(request: Request, state: StateDep) -> Response:
    """Check the token (constant-time, against every admin token) and start a session."""
    form = await read_form(request)
    next_path = safe_next(form.get("next"))
    session = current_session(request, state)
    if session is None or not csrf_matches(key_for(state), session, form.get("csrf_token")):
        # The form's session expired, or the form was not ours: a fresh one, nothing checked.
        return sign_in_page(
            request,
            state,
            new_session(None, time.time()),
            next_path,
            error="The sign-in form had expired. Enter the token again.",
            status_code=403,
        )
    token = matching_token(form.get("token") or "", state.admin_tokens)
    if token is None:
        log.warning("console sign-in refused")
        return sign_in_page(
            request,
            state,
            session,
            next_path,
            error="That is not an admin token.",
            status_code=401,
        )
    signed_in = new_session(token_fingerprint(token), time.time())
    log.info("console sign-in", extra={"actor": signed_in.actor})
    response = RedirectResponse(next_path, status_code=303)
    set_session_cookie(response, request, state, signed_in)
    return response


@router.post("/sign-out")
async def sign_out(request: Request, state: StateDep) -> Response:
    """End the session: the cookie is deleted."""
    session = current_session(request, state)
    if session is not None and session.signed_in:
        form = await read_form(request)
        if not csrf_matches(key_for(state), session, form.get("csrf_token")):
            raise ConsoleError(
                403, "Request refused", "the sign-out form did not carry this session's token"
            )
        log.info("console sign-out", extra={"actor": session.actor})
    response = RedirectResponse(f"{SIGN_IN_PATH}?signed_out=1", status_code=303)
    clear_session_cookie(response, request)
    return response
