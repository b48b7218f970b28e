"""The log handler: INFO lines of one event-loop turn leave in one write, in order; and the
JSON line each event is: its fixed keys, then its fields."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import threading
from datetime import UTC, datetime
from decimal import Decimal

import httpx
import pytest

from service.core.logging import JsonFormatter, LoopBatchedStreamHandler


class CountingStream(io.StringIO):
    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def write(self, text: str) -> int:
        self.writes += 1
        return super().write(text)


def logger_with(stream: CountingStream) -> logging.Logger:
    handler = LoopBatchedStreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger(f"test-batched-{id(stream)}")
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.setLevel(logging.INFO)
    return logger


def events(stream: CountingStream) -> list[str]:
    import json

    return [json.loads(line)["event"] for line in stream.getvalue().splitlines()]


def test_info_lines_of_one_loop_turn_are_written_together_after_it() -> None:
    stream = CountingStream()
    log = logger_with(stream)

    async def main() -> tuple[int, int]:
        for n in range(30):
            log.info(f"delivery {n}")
        during = stream.writes
        await asyncio.sleep(0)  # the turn ends: the held lines go out
        await asyncio.sleep(0)
        return during, stream.writes

    during, after = asyncio.run(main())
    assert (during, after) == (0, 1)
    assert events(stream) == [f"delivery {n}" for n in range(30)]


def test_a_warning_goes_out_at_once_after_the_lines_held_before_it() -> None:
    stream = CountingStream()
    log = logger_with(stream)

    async def main() -> list[str]:
        log.info("first")
        log.warning("second")
        return events(stream)

    assert asyncio.run(main()) == ["first", "second"]


def test_off_the_loop_a_line_is_written_at_once() -> None:
    stream = CountingStream()
    log = logger_with(stream)
    log.info("no loop here")
    assert events(stream) == ["no loop here"]


def test_a_line_from_another_thread_is_not_held_for_the_loops_turn() -> None:
    stream = CountingStream()
    log = logger_with(stream)

    async def main() -> tuple[list[str], list[str]]:
        log.info("held")  # the loop's write is now scheduled for the end of this turn
        thread = threading.Thread(target=log.info, args=("from a thread",))
        thread.start()
        thread.join()
        written = events(stream)
        await asyncio.sleep(0)
        return written, events(stream)

    during, after = asyncio.run(main())
    assert during == ["held", "from a thread"]
    assert after == during


def test_a_line_after_its_loop_stopped_is_not_held_for_a_turn_that_never_comes() -> None:
    stream = CountingStream()
    log = logger_with(stream)
    loop = asyncio.new_event_loop()
    try:

        def log_and_stop() -> None:
            log.info("in the last turn")  # schedules a write on the next turn
            loop.stop()

        loop.call_soon(log_and_stop)
        loop.run_forever()  # stops before the scheduled write runs
        log.info("after the loop")
        assert events(stream) == ["in the last turn", "after the loop"]
    finally:
        loop.close()


def test_lines_held_when_the_process_shuts_down_are_flushed() -> None:
    stream = CountingStream()
    log = logger_with(stream)

    async def main() -> None:
        log.info("last words")
        log.handlers[0].flush()  # what logging.shutdown() does at exit

    asyncio.run(main())
    assert events(stream) == ["last words"]


def installed_stream(fmt: str) -> io.StringIO:
    """`configure_logging`'s handler, writing to a buffer instead of stderr."""
    from service.core.logging import configure_logging

    configure_logging("INFO", fmt, "http")
    stream = io.StringIO()
    logging.getLogger().handlers[0].stream = stream  # type: ignore[attr-defined]
    return stream


def test_an_info_event_is_the_line_logger_info_writes() -> None:
    from service.core.logging import REQUEST_ID, info_event

    log = logging.getLogger("service.ingest")
    token = REQUEST_ID.set("rid-1")
    try:
        for fmt in ("json", "text"):
            stream = installed_stream(fmt)
            fields = {"source": "s", "message_id": None, "outcome": "accepted", "ms": 1.25}
            log.info("delivery", extra=dict(fields))
            info_event(log, "delivery", dict(fields))
            by_record, direct = stream.getvalue().splitlines()
            if fmt == "json":
                import json

                a, b = json.loads(by_record), json.loads(direct)
                assert a.pop("ts")[:19] == b.pop("ts")[:19]
                assert list(a.items()) == list(b.items())
                assert a["role"] == "http"
                assert a["request_id"] == "rid-1"
            else:
                assert by_record[8:] == direct[8:]  # after the HH:MM:SS stamp
    finally:
        REQUEST_ID.reset(token)


def test_an_info_event_is_a_record_when_anything_else_would_see_it() -> None:
    from service.core.logging import info_event

    stream = installed_stream("json")
    log = logging.getLogger("service.ingest")
    seen: list[logging.LogRecord] = []

    class Capture(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    capture = Capture()
    logging.getLogger().addHandler(capture)
    try:
        info_event(log, "delivery", {"source": "s"})
    finally:
        logging.getLogger().removeHandler(capture)
    assert [(r.getMessage(), r.source) for r in seen] == [("delivery", "s")]  # type: ignore[attr-defined]
    assert '"event":"delivery"' in stream.getvalue()  # and the installed handler wrote it too

    logging.getLogger("service").setLevel(logging.WARNING)
    try:
        info_event(log, "delivery", {"source": "quiet"})
    finally:
        logging.getLogger("service").setLevel(logging.NOTSET)
    assert "quiet" not in stream.getvalue()


def test_an_info_event_in_a_forked_child_carries_the_childs_pid() -> None:
    # serve forks its HTTP and processing processes: their lines must not say the parent's pid.
    import json
    import os

    from service.core.logging import info_event
    from tests.forking import in_forked_child

    stream = installed_stream("json")
    log = logging.getLogger("service.ingest")

    def log_a_line() -> str:
        info_event(log, "delivery", {"source": "child"})
        return stream.getvalue()

    pid, line = in_forked_child(log_a_line)
    info_event(log, "delivery", {"source": "parent"})
    assert json.loads(line)["pid"] == pid
    assert json.loads(stream.getvalue())["pid"] == os.getpid()


def reference_line(
    created: float, level: str, logger: str, event: str, pid: int, fields: dict[str, object]
) -> str:
    """A JSON line as its documented shape says: the fixed keys in order, then the fields (one
    named as a fixed key takes that key's place); orjson, else python-json-logger's encoder."""
    import orjson
    import pythonjsonlogger.json

    stamp = datetime.fromtimestamp(created, UTC).isoformat(timespec="milliseconds")
    data = {"ts": stamp, "level": level.lower(), "logger": logger, "event": event, "pid": pid}
    data.update(fields)
    encoder = pythonjsonlogger.json.JsonEncoder()
    try:
        return orjson.dumps(data, default=encoder.default).decode()
    except TypeError:
        return encoder.encode(data)


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"source": "s", "message_id": None, "duration_ms": 1.25, "nested": {"a": [1, "b"]}},
        {"event": "a field's own", "pid": "replaced", "source": "s"},
        {"amount": Decimal("1.50"), "tags": ["x"]},  # orjson asks python-json-logger's default
        {"detail": "lone \ud800 surrogate"},  # orjson refuses it: python-json-logger writes it
    ],
)
@pytest.mark.parametrize("event", ["delivery", "caf\u00e9", "lone \udc00"])
def test_a_json_line_is_its_fixed_keys_then_its_fields(
    fields: dict[str, object], event: str
) -> None:
    formatter = JsonFormatter()
    created = 1764460800.1239
    expected = reference_line(created, "INFO", "service.api.ingest", event, 42, fields)
    for _ in range(2):  # the second within the same second's remembered text
        line = formatter.event_line(created, "INFO", "service.api.ingest", event, 42, fields)
        assert line == expected
    assert json.loads(line)["ts"] == "2025-11-30T00:00:00.123+00:00"


def test_a_line_a_millisecond_later_has_its_own_stamp() -> None:
    formatter = JsonFormatter()
    stamps = [
        json.loads(formatter.event_line(t, "INFO", "x", "e", 1, {}))["ts"]
        for t in (1764460800.0005, 1764460800.0009, 1764460800.0012, 1764460801.0001)
    ]
    assert stamps == [
        "2025-11-30T00:00:00.000+00:00",
        "2025-11-30T00:00:00.000+00:00",
        "2025-11-30T00:00:00.001+00:00",
        "2025-11-30T00:00:01.000+00:00",
    ]


def test_no_level_logs_the_url_an_http_client_called(capsys: pytest.CaptureFixture[str]) -> None:
    # An alert webhook's URL is its credential: httpx's own "HTTP Request: POST <url>" line
    # (INFO) would write it down, and so would httpcore's chatter at DEBUG.
    from service.core.logging import configure_logging

    configure_logging("DEBUG", "json", role="processing")
    url = "https://hooks.slack.com/services/T0/B0/the-secret-part"
    transport = httpx.MockTransport(lambda request: httpx.Response(200))
    with httpx.Client(transport=transport) as client:
        assert client.post(url, json={"text": "x"}).status_code == 200
    logging.getLogger("service.alerts").info("dead-letter alert sent")
    err = capsys.readouterr().err
    assert "dead-letter alert sent" in err  # the handler was writing
    assert "the-secret-part" not in err
