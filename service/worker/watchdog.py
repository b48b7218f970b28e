"""Notices a handler that blocks the worker's event loop, and names it in the log."""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
from types import FrameType

from service.processing.runner import call_handlers

log = logging.getLogger("service.worker.watchdog")

# A loop that has not run its callbacks for this long is blocked: nothing else of the process
# (claims, timeouts, the listener) moves meanwhile.
BLOCKED_SECONDS = 1.0
BEAT_SECONDS = 0.1


class LoopWatchdog:
    """A thread that watches `loop`'s heartbeat; when it stops, it logs what blocks it.

    The culprit is read from the blocked thread's own stack: the `call_handlers` frame there
    holds the message and the handler it awaits. Logged once when the block is noticed (with
    source, message id and handler) and once when it ends (with how long it lasted).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, threshold: float = BLOCKED_SECONDS):
        self._loop = loop
        self._threshold = threshold
        self._last_beat = time.monotonic()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="loop-watchdog", daemon=True)
        self._loop_thread = threading.get_ident()
        self._beat_handle: asyncio.TimerHandle | None = None

    def __enter__(self) -> LoopWatchdog:
        self._beat()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopped.set()
        if self._beat_handle is not None:
            self._beat_handle.cancel()
        self._thread.join(timeout=2)

    def _beat(self) -> None:
        self._last_beat = time.monotonic()
        self._beat_handle = self._loop.call_later(BEAT_SECONDS, self._beat)

    def _watch(self) -> None:
        blocked_since: float | None = None
        while not self._stopped.wait(BEAT_SECONDS):
            last = self._last_beat
            stalled = time.monotonic() - last
            if stalled > self._threshold and blocked_since is None:
                blocked_since = last
                log.warning(
                    "event loop blocked: a handler is not yielding (use async I/O, or "
                    "asyncio.to_thread for blocking and CPU-bound work)",
                    extra={"blocked_s": round(stalled, 3), **self._culprit()},
                )
            elif stalled <= self._threshold and blocked_since is not None:
                log.warning(
                    "event loop unblocked",
                    extra={"blocked_s": round(last - blocked_since, 3)},
                )
                blocked_since = None

    def _culprit(self) -> dict[str, object]:
        frame: FrameType | None = sys._current_frames().get(self._loop_thread)
        while frame is not None:
            if frame.f_code is call_handlers.__code__:
                message = frame.f_locals.get("message")
                handler = frame.f_locals.get("handler")
                return {
                    "source": getattr(message, "source", None),
                    "message_id": getattr(message, "message_id", None),
                    "id": getattr(message, "id", None),
                    "handler": handler_name(handler),
                }
            frame = frame.f_back
        return {"handler": None}


def handler_name(handler: object) -> str | None:
    if handler is None:
        return None
    module = getattr(handler, "__module__", "?")
    name = getattr(handler, "__qualname__", repr(handler))
    return f"{module}:{name}"
