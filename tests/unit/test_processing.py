"""Pure logic of processing: backoff, failure classification, Retry-After, handler resolution."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path

import httpx
import pytest

from service import InboxMessage, PermanentFailure, RetryLater
from service.cli import main
from service.core.settings import ConfigError
from service.processing.forward import deferral_seconds, parse_retry_after
from service.processing.pipeline import resolve_pipelines
from service.processing.policy import backoff_delay, classify_failure
from service.sources.config import SourceConfig
from service.sources.config_file import parse_inbox_config
from tests.cli_runner import refused_at_start
from tests.processing_helpers import config

CFG = SourceConfig(kind="generic", max_attempts=3, backoff_base_seconds=2, backoff_max_seconds=60)


def test_backoff_is_full_jitter_under_an_exponential_cap() -> None:
    assert backoff_delay(1, 2, 60, rand=lambda: 1.0) == 2
    assert backoff_delay(3, 2, 60, rand=lambda: 1.0) == 8
    assert backoff_delay(10, 2, 60, rand=lambda: 1.0) == 60
    assert backoff_delay(10_000, 2, 60, rand=lambda: 0.5) == 30
    assert backoff_delay(4, 2, 60, rand=lambda: 0.0) == 0
    assert all(0 <= backoff_delay(5, 2, 60) <= 32 for _ in range(200))


def test_failures_are_classified() -> None:
    assert classify_failure(ValueError("x"), 1, CFG).status == "retrying"
    assert classify_failure(ValueError("x"), 3, CFG).status == "dead"
    permanent = classify_failure(PermanentFailure("bad"), 1, CFG)
    assert (permanent.status, permanent.outcome) == ("dead", "dead")
    later = classify_failure(RetryLater(after_seconds=42), 2, CFG)
    assert (later.status, later.outcome, later.delay_seconds) == ("retrying", "retry_later", 42)
    assert classify_failure(RetryLater(after_seconds=42), 3, CFG).status == "dead"
    long = classify_failure(RuntimeError("e" * 10_000), 1, CFG)
    assert len(long.error) == 2_000
    assert long.traceback is not None


def test_retry_later_refuses_a_negative_delay() -> None:
    with pytest.raises(ValueError, match="after_seconds"):
        RetryLater(after_seconds=-1)


def test_retry_after_reads_seconds_and_http_dates() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    assert parse_retry_after("3") == 3
    assert parse_retry_after(format_datetime(now + timedelta(seconds=90), usegmt=True), now) == 90
    assert parse_retry_after(format_datetime(now - timedelta(seconds=90), usegmt=True), now) == 0
    assert parse_retry_after("soon") is None
    assert parse_retry_after(None) is None


def test_only_a_429_or_503_with_a_valid_retry_after_defers_within_a_second_and_an_hour() -> None:
    def answer(status: int, retry_after: str | None) -> httpx.Response:
        return httpx.Response(status, headers={"retry-after": retry_after} if retry_after else {})

    assert deferral_seconds(answer(429, "30")) == 30
    assert deferral_seconds(answer(503, "30")) == 30
    assert deferral_seconds(answer(429, "0")) == 1  # never a loop of calls
    assert deferral_seconds(answer(503, "86400")) == 3600  # asked again within the hour
    assert deferral_seconds(answer(429, None)) is None
    assert deferral_seconds(answer(503, "soon")) is None
    assert deferral_seconds(answer(500, "30")) is None
    assert deferral_seconds(answer(408, "30")) is None


def test_payload_is_parsed_json_or_none() -> None:
    def message(body: bytes) -> InboxMessage:
        return InboxMessage(1, "s", "m", None, 1, {}, body)

    assert message(b'{"a": [1]}').payload == {"a": [1]}
    assert message(b"not json").payload is None
    assert message(b"\xff\xfe").payload is None


def test_handlers_resolve_and_match_event_type_globs() -> None:
    inbox = parse_inbox_config(
        config(
            "tests.handlers:record",
            handler=[{"target": "tests.handlers:permanent", "event_types": ["charge.refund*"]}],
        )
    )
    pipeline = resolve_pipelines(inbox)["hooks"]
    names = [h.__name__ for h in pipeline.handlers_for("charge.refunded")]
    assert names == ["record", "permanent"]
    assert [h.__name__ for h in pipeline.handlers_for("charge.created")] == ["record"]
    assert [h.__name__ for h in pipeline.handlers_for(None)] == ["record"]


@pytest.mark.parametrize(
    ("source_extra", "message"),
    [
        (
            {"handlers": ["tests.nope:handle"]},
            "sources.hooks.handlers[0]: cannot import module 'tests.nope': ModuleNotFoundError",
        ),
        (
            {"handlers": ["tests.handlers:missing"]},
            "sources.hooks.handlers[0]: module 'tests.handlers' has no attribute 'missing'",
        ),
        (
            {"handler": [{"target": "tests.handlers:not_async"}]},
            "sources.hooks.handler[0].target: tests.handlers:not_async must be an `async def",
        ),
        (
            {"handlers": ["myapp.handlers.on_charge"]},
            "sources.hooks.handlers[0]: write a handler as module:function, as in "
            "myapp.billing:on_payment, not 'myapp.handlers.on_charge' "
            "(did you mean myapp.handlers:on_charge?)",
        ),
        (
            {"handlers": ["tests.handlers:record", "tests.handlers:"]},
            "sources.hooks.handlers[1]: write a handler as module:function",
        ),
        (
            {"handler": [{"target": "tests.handlers.record"}]},
            "sources.hooks.handler[0].target: write a handler as module:function",
        ),
        (
            {"handler": [{"target": "tests.handlers:record", "event_types": []}]},
            "sources.hooks.handler[0].event_types: ",
        ),
        (
            {"handlers": ["tests.handlers:record"], "forward": {"url": "http://x/"}},
            "sources.hooks.forward: a source either forwards or runs Python handlers",
        ),
        (
            {"mode": "sync", "forward": {"url": "http://x/"}},
            "sources.hooks.mode: sync mode runs Python handlers",
        ),
    ],
)
def test_bad_handler_configuration_is_refused_naming_source_and_field(
    source_extra: dict[str, object], message: str
) -> None:
    cfg = config()
    cfg["sources"]["hooks"].update(source_extra)
    with pytest.raises(ConfigError) as caught:
        resolve_pipelines(parse_inbox_config(cfg))
    assert str(caught.value).startswith(message)
    assert "\n" not in str(caught.value)


def test_worker_command_stops_with_one_line_on_a_bad_handler(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "inbox.toml"
    toml = (
        '[sources.hooks]\nkind = "generic"\nid_header = "X-Id"\nhandlers = ["tests.nope:handle"]\n'
    )
    assert refused_at_start(monkeypatch, path, toml, "worker").startswith(
        f"config error: {path}: sources.hooks.handlers[0]: cannot import module 'tests.nope'"
    )


def test_worker_command_has_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["worker", "--help"])
    out = capsys.readouterr().out
    assert "--concurrency" in out
    assert "grace period" in out


class _OwnError(Exception):
    pass


def test_last_error_names_exceptions_by_their_public_names() -> None:
    config = SourceConfig(kind="generic", max_attempts=3)
    permanent = classify_failure(PermanentFailure("no order id"), 1, config)
    assert (permanent.error_type, permanent.error) == ("service.PermanentFailure", "no order id")
    assert classify_failure(RetryLater(5), 1, config).error_type == "service.RetryLater"
    assert classify_failure(ValueError("x"), 1, config).error_type == "ValueError"
    assert classify_failure(_OwnError("x"), 1, config).error_type == f"{__name__}._OwnError"
    assert classify_failure(ConfigError("x"), 1, config).error_type == "ConfigError"
