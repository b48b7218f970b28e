"""Admin tokens checked on each admin request, in constant time (`AdminDep`); which tokens are in
force is `service.core.admin_tokens`."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from service.api.problems import ProblemError
from service.api.state import StateDep


def token_fingerprint(token: str) -> str:
    """A short, non-secret name for a token (a SHA-256 prefix), recorded as an admin actor."""
    return "token:" + hashlib.sha256(token.encode()).hexdigest()[:12]


def matching_token(offered: str, tokens: Sequence[str]) -> str | None:
    """The configured token equal to `offered`, compared in constant time against every one.

    Both sides are hashed first so the comparison does not leak the tokens' lengths, and the
    loop never stops early, so the time taken does not say which token (if any) matched.
    """
    offered_digest = hashlib.sha256(offered.encode()).digest()
    found: str | None = None
    for token in tokens:
        if hmac.compare_digest(offered_digest, hashlib.sha256(token.encode()).digest()):
            found = token
    return found


@dataclass(frozen=True)
class Admin:
    """The caller of an admin route, known only by its token's fingerprint."""

    actor: str


# auto_error=False: a missing or non-Bearer header becomes our own 401 problem, not FastAPI's 403.
_bearer = HTTPBearer(
    auto_error=False,
    scheme_name="AdminToken",
    description="An admin token from INBOX_ADMIN_TOKENS (or the one `serve` generated).",
)

_CHALLENGE = 'Bearer realm="webhook-inbox admin"'


def require_admin(
    state: StateDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Admin:
    """Let the request through only with `Authorization: Bearer <an admin token>`."""
    if credentials is None:
        raise ProblemError(
            401,
            "missing admin credentials: send Authorization: Bearer <admin token>",
            headers={"WWW-Authenticate": _CHALLENGE},
        )
    token = matching_token(credentials.credentials, state.admin_tokens)
    if token is None:
        raise ProblemError(
            401,
            "the bearer token is not an admin token",
            headers={"WWW-Authenticate": f'{_CHALLENGE}, error="invalid_token"'},
        )
    return Admin(actor=token_fingerprint(token))


AdminDep = Annotated[Admin, Depends(require_admin)]
