"""RFC 9457 problem responses: every error this service answers has this shape."""

from __future__ import annotations

from collections.abc import Mapping
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse, Response

from service.core.settings import error_path

PROBLEM_MEDIA_TYPE = "application/problem+json"
RETRY_AFTER_SECONDS = 5


class Problem(BaseModel):
    """An RFC 9457 problem document."""

    type: str = Field(default="about:blank", description="A URI naming the problem type.")
    title: str = Field(description="Short summary of the problem type.")
    status: int = Field(description="The HTTP status code.")
    detail: str = Field(description="What went wrong with this request, and what was expected.")


class ProblemResponse(JSONResponse):
    media_type = PROBLEM_MEDIA_TYPE


def problem(
    status: int,
    detail: str,
    *,
    title: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> Response:
    body = Problem(title=title or HTTPStatus(status).phrase, status=status, detail=detail)
    return ProblemResponse(body.model_dump(), status_code=status, headers=dict(headers or {}))


def unavailable(detail: str = "the database is unavailable; nothing was recorded") -> Response:
    return problem(503, detail, headers={"Retry-After": str(RETRY_AFTER_SECONDS)})


class ProblemError(Exception):
    """Raise from a route to answer with a problem."""

    def __init__(self, status: int, detail: str, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.headers = headers


def problem_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` entries documenting problem answers."""
    return {
        status: {
            "model": Problem,
            "description": HTTPStatus(status).phrase,
            "content": {PROBLEM_MEDIA_TYPE: {}},
        }
        for status in statuses
    }


def install_problem_handlers(app: FastAPI) -> None:
    async def on_http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        return problem(exc.status_code, str(exc.detail), headers=exc.headers)

    async def on_validation_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        errors = exc.errors()
        parts = []
        for err in errors[:3]:
            # Written as config errors are: `body.status[1]`, the reason without pydantic's
            # "Value error, " prefix.
            where = error_path(*err.get("loc", ()))
            message = str(err.get("msg", "invalid")).removeprefix("Value error, ")
            parts.append(f"{where}: {message}")
        return problem(422, "; ".join(parts) or "invalid request")

    async def on_problem(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ProblemError)
        return problem(exc.status, exc.detail, headers=exc.headers)

    async def on_unexpected(request: Request, exc: Exception) -> Response:
        return problem(500, "internal error; the request was not recorded")

    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(ProblemError, on_problem)
    app.add_exception_handler(Exception, on_unexpected)
