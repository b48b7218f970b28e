"""The console's static files (CSS, one script), served from the package with cache headers.

Pages link each file with its content hash in the query (`console.css?v=…`), so a browser may
keep it for a year: a new release changes the link, not what an old link names.
"""

from __future__ import annotations

import hashlib
import os
from functools import cache
from pathlib import Path

from starlette.responses import Response
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

ASSETS_DIR = Path(__file__).parent / "static"
STATIC_PATH = "/console/static"
VERSIONED = "public, max-age=31536000, immutable"
UNVERSIONED = "no-cache"  # revalidate (ETag) when a link carries no hash


@cache
def asset_version(name: str) -> str:
    return hashlib.sha256((ASSETS_DIR / name).read_bytes()).hexdigest()[:12]


def asset_url(name: str) -> str:
    return f"{STATIC_PATH}/{name}?v={asset_version(name)}"


class StaticAssets(StaticFiles):
    """StaticFiles, with Cache-Control: long for hashed links, revalidated otherwise."""

    def __init__(self) -> None:
        super().__init__(directory=ASSETS_DIR)

    def file_response(
        self,
        full_path: str | os.PathLike[str],
        stat_result: os.stat_result,
        scope: Scope,
        status_code: int = 200,
    ) -> Response:
        response = super().file_response(full_path, stat_result, scope, status_code)
        versioned = b"v=" in scope.get("query_string", b"")
        response.headers["Cache-Control"] = VERSIONED if versioned else UNVERSIONED
        return response
