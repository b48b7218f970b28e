"""Fingerprints of failed attempts: what makes two failures the same cause, so that a few hundred
messages failing for one reason are one issue (`inbox_issues`), not a few hundred errors.

The parts are names, never positions: no line number (an edit elsewhere in a file keeps the
fingerprint), no id(), pid or address (another process, or the next start, gives the same).
"""

from __future__ import annotations

import hashlib
import os
import sysconfig
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from types import CodeType, FrameType, TracebackType
from urllib.parse import urlsplit

import orjson

from service.store.results import Fingerprint

KEY_CHARS = 16
# The inbox's own code: a failure's frame is the application's, never the runner's.
SERVICE_DIR = str(Path(__file__).resolve().parents[1]) + os.sep
# The standard library and installed packages; a venv's site-packages is under its prefix,
# not the stdlib's, so both are named.
LIBRARY_DIRS = tuple(
    {
        str(Path(path).resolve()) + os.sep
        for name in ("stdlib", "platstdlib", "purelib", "platlib")
        if (path := sysconfig.get_paths().get(name))
    }
)
# Exceptions looked through for a frame (`raise X from exc`, an error while handling another).
MAX_CHAINED = 5


def fingerprint(
    source: str,
    error_type: str,
    *,
    destination: str | None = None,
    handler: str | None = None,
    frame: str | None = None,
    detail: str | None = None,
) -> Fingerprint:
    """The fingerprint of these parts: sha256 of their JSON array, its first KEY_CHARS hex."""
    parts = [source, destination, handler, error_type, frame, detail]
    key = hashlib.sha256(orjson.dumps(parts)).hexdigest()[:KEY_CHARS]
    return Fingerprint(key, source, destination, handler, error_type, frame, detail)


def handler_fingerprint(
    exc: BaseException,
    source: str,
    destination: str | None,
    error_type: str,
    handler_loop: CodeType,
) -> Fingerprint:
    """Of a handler's failure: the handler that raised (found in `handler_loop`'s frame, the
    runner's loop over a message's handlers, as its local `handler`) and the innermost frame of
    the application's code, looked for through the exception's chain."""
    handler: str | None = None
    frame: str | None = None
    for link in _chain(exc):
        frames = [f for f, _ in _walk(link.__traceback__)]
        handler = handler or _running_handler(frames, handler_loop)
        frame = frame or app_frame(frames)
        if handler and frame:
            break
    return fingerprint(source, error_type, destination=destination, handler=handler, frame=frame)


def app_frame(frames: list[FrameType]) -> str | None:
    """`module:function` of the innermost of `frames` (outermost first) that is the
    application's own: neither the inbox's nor the standard library's nor a package's."""
    for frame in reversed(frames):
        if is_application_file(frame.f_code.co_filename):
            return frame_name(frame)
    return None


@cache
def is_application_file(filename: str) -> bool:
    if filename.startswith("<"):  # frozen modules, exec()'d strings
        return False
    path = str(Path(filename).resolve())
    if path.startswith(SERVICE_DIR) or path.startswith(LIBRARY_DIRS):
        return False
    parts = Path(path).parts
    return "site-packages" not in parts and "dist-packages" not in parts


def frame_name(frame: FrameType) -> str:
    module = frame.f_globals.get("__name__", "?")
    return f"{module}:{frame.f_code.co_qualname}"


def _running_handler(frames: list[FrameType], handler_loop: CodeType) -> str | None:
    for frame in frames:
        if frame.f_code is handler_loop:
            running = frame.f_locals.get("handler")
            if running is None:
                return None
            module = getattr(running, "__module__", None) or "?"
            name = getattr(running, "__qualname__", None) or type(running).__qualname__
            return f"{module}:{name}"
    return None


def _walk(tb: TracebackType | None) -> Iterator[tuple[FrameType, int]]:
    while tb is not None:
        yield tb.tb_frame, tb.tb_lineno
        tb = tb.tb_next


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and len(seen) < MAX_CHAINED and id(link) not in seen:
        seen.add(id(link))
        yield link
        link = link.__cause__ or (None if link.__suppress_context__ else link.__context__)


def status_class(status: int) -> str:
    """A forward's answer as its cause: `429` (a throttle is its own cause), else `5xx`,
    `4xx`, … ."""
    return "429" if status == 429 else f"{status // 100}xx"


def endpoint_of(url: str) -> str:
    """`host:port/path` of a forward URL (the scheme's port when none is written); no query,
    which may carry a token, nor credentials. (urllib, not httpx: the HTTP processes, which
    load this module with the runner, do not load the worker's HTTP client.)"""
    parsed = urlsplit(url)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    return f"{parsed.hostname}:{port}{parsed.path or '/'}"


def forward_fingerprint(
    source: str,
    destination: str | None,
    error_type: str,
    cause: str,
    url: str,
    endpoint: str | None = None,
) -> Fingerprint:
    """Of a forward's failure: `cause` (`status_class`, `timeout` or the connection error's
    type) and its endpoint: an outbox endpoint's name, else the URL's `endpoint_of`."""
    where = endpoint if endpoint is not None else endpoint_of(url)
    return fingerprint(source, error_type, destination=destination, detail=f"{cause} {where}")
