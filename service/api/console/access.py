"""Who may use the console: a signed-in session for every page, and on every POST that
session's CSRF token. Errors here are pages for people, not problem documents."""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import lru_cache
from typing import Annotated, Any
from urllib.parse import parse_qsl, urlencode

from fastapi import Depends, Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from service.api.console.session import (
    COOKIE,
    COOKIE_PATH,
    Session,
    csrf_matches,
    csrf_token,
    decode_session,
    encode_session,
    session_key,
)
from service.api.console.templating import page
from service.api.security import Admin
from service.api.state import AppState, StateDep
from service.sources.base import media_type_of

SIGN_IN_PATH = "/console/sign-in"
FORM_MAX_BYTES = 64 * 1024  # filters and a token: a few hundred bytes in practice
FORM_MAX_FIELDS = 100
CONSOLE_ACTOR_PREFIX = "console:"  # the history tells console actions from API calls


class ConsoleError(Exception):
    """Answered with an error page of this status."""

    def __init__(self, status: int, title: str, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.title = title
        self.detail = detail


class SignInRequired(Exception):
    """No signed-in session: a page redirects to the sign-in form, a refreshed part of a page
    answers 401 (its script reloads the page), and a POST is refused with 403."""


@dataclass(frozen=True)
class Operator:
    """A signed-in console user; `admin.actor` is what the history records for their actions."""

    admin: Admin
    csrf: str

    def page(self, template: str, *, title: str, nav: str = "", **context: Any) -> HTMLResponse:
        """A page of the signed-in console: its navigation, and forms that carry `csrf`."""
        return page(template, title=title, csrf=self.csrf, nav=nav, **context)


@dataclass(frozen=True)
class Form:
    fields: list[tuple[str, str]]

    def get(self, name: str) -> str | None:
        return next((v for k, v in self.fields if k == name), None)


@lru_cache(maxsize=8)
def _key(tokens: tuple[str, ...]) -> bytes:
    return session_key(tokens)


def key_for(state: AppState) -> bytes:
    return _key(tuple(state.admin_tokens))


def current_session(request: Request, state: AppState) -> Session | None:
    return decode_session(key_for(state), request.cookies.get(COOKIE), time.time())


def set_session_cookie(
    response: Response, request: Request, state: AppState, session: Session
) -> None:
    response.set_cookie(
        COOKIE,
        encode_session(key_for(state), session),
        max_age=max(session.expires_at - int(time.time()), 0),
        path=COOKIE_PATH,
        secure=request.url.scheme == "https",
        httponly=True,
        samesite="strict",
    )


def clear_session_cookie(response: Response, request: Request) -> None:
    response.delete_cookie(
        COOKIE,
        path=COOKIE_PATH,
        secure=request.url.scheme == "https",
        httponly=True,
        samesite="strict",
    )


def operator_of(state: AppState, session: Session) -> Operator:
    assert session.actor is not None
    return Operator(
        Admin(CONSOLE_ACTOR_PREFIX + session.actor), csrf_token(key_for(state), session)
    )


async def require_operator(request: Request, state: StateDep) -> Operator:
    session = current_session(request, state)
    if session is None or not session.signed_in:
        raise SignInRequired
    return operator_of(state, session)


async def read_form(request: Request) -> Form:
    """An `application/x-www-form-urlencoded` body (all the console's forms send), bounded.
    Any other body has no fields, so no CSRF token either: the request is refused with 403."""
    media = media_type_of(request.headers.get("content-type", ""))
    if media != "application/x-www-form-urlencoded":
        return Form([])
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > FORM_MAX_BYTES:
            raise ConsoleError(413, "Form too large", "the form sent more than 64 KiB")
    try:
        fields = parse_qsl(
            body.decode("utf-8"), keep_blank_values=True, max_num_fields=FORM_MAX_FIELDS
        )
    except (UnicodeDecodeError, ValueError):
        raise ConsoleError(400, "Unreadable form", "the form could not be read") from None
    return Form(fields)


async def require_action(request: Request, state: StateDep) -> tuple[Operator, Form]:
    """A state-changing request: signed in, and carrying this session's CSRF token."""
    session = current_session(request, state)
    if session is None or not session.signed_in:
        raise SignInRequired
    form = await read_form(request)
    if not csrf_matches(key_for(state), session, form.get("csrf_token")):
        raise ConsoleError(
            403,
            "Request refused",
            "the form did not carry this session's security token; reload the page and try again",
        )
    return operator_of(state, session), form


OperatorDep = Annotated[Operator, Depends(require_operator)]
ActionDep = Annotated[tuple[Operator, Form], Depends(require_action)]


def safe_next(target: str | None) -> str:
    """Where to go after signing in: a console path of this site, never another site."""
    if (
        target
        and target.startswith("/console/")
        and not target.startswith("//")
        and "\\" not in target
        and not target.startswith(SIGN_IN_PATH)
    ):
        return target
    return "/console/"


async def on_sign_in_required(request: Request, exc: Exception) -> Response:
    if request.method == "GET" and not request.url.path.endswith("/live"):
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        return RedirectResponse(f"{SIGN_IN_PATH}?{urlencode({'next': target})}", status_code=303)
    detail = "sign in to the console first; your session has ended or was never started"
    if request.method == "GET":
        return Response(detail, status_code=401, media_type="text/plain")
    return page("error.html", title="Sign in first", csrf=None, detail=detail, status_code=403)


async def on_console_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ConsoleError)
    state: AppState = request.app.state.inbox
    session = current_session(request, state)
    csrf = operator_of(state, session).csrf if session and session.signed_in else None
    return page("error.html", title=exc.title, csrf=csrf, detail=exc.detail, status_code=exc.status)
