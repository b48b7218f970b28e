"""The console's pure view logic: ages, the chart's scale and geometry, bodies fit to read."""

from __future__ import annotations

import base64
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from service.api.admin.models import MessageDetail, MessageQuery, MinuteActivity
from service.api.console import views


@pytest.mark.parametrize(
    ("seconds", "said"),
    [
        (None, "—"),
        (-3, "0 s"),
        (42.4, "42 s"),
        (60, "1 min"),
        (3599, "59 min"),
        (3600, "1 h"),
        (3 * 3600 + 20 * 60, "3 h 20 min"),
        (2 * 86400, "2 d"),
        (2 * 86400 + 4 * 3600 + 59, "2 d 4 h"),
    ],
)
def test_ages_read_as_people_say_them(seconds: float | None, said: str) -> None:
    assert views.age(seconds) == said


@pytest.mark.parametrize(
    ("largest", "scale"), [(0, 1), (1, 1), (2, 2), (3, 5), (7, 10), (10, 10), (11, 20), (480, 500)]
)
def test_the_chart_scale_is_a_round_number_at_least_the_largest_value(
    largest: int, scale: int
) -> None:
    assert views.nice_ceiling(largest) == scale


def test_the_chart_draws_each_series_across_the_plot() -> None:
    start = datetime(2026, 12, 1, 3, 0, tzinfo=UTC)
    minutes = [
        MinuteActivity(minute=start + timedelta(minutes=i), received=i, processed=0, failed=0)
        for i in range(60)
    ]
    chart = views.chart(minutes)
    received = [tuple(map(float, p.split(","))) for p in chart.series[0].points.split()]
    assert len(received) == 60
    assert received[0] == (chart.plot_left, chart.plot_bottom)
    assert received[-1][0] == chart.plot_right
    assert chart.plot_top < received[-1][1] < chart.plot_bottom  # 59 on a scale of 100
    assert [s.total for s in chart.series] == [sum(range(60)), 0, 0]
    assert [t.label for t in chart.y_ticks] == ["0", "50", "100"]
    assert [t.label for t in chart.x_ticks] == ["60 min ago", "30 min ago", "now"]
    assert len(chart.busy_minutes) == 59  # the first minute had nothing


def detail(**fields: Any) -> MessageDetail:
    now = datetime.now(UTC)
    base: dict[str, Any] = {
        "id": 1,
        "source": "s",
        "message_id": "m",
        "event_type": None,
        "status": "dead",
        "attempt_count": 1,
        "attempt_count_total": 1,
        "receive_count": 1,
        "received_at": now,
        "last_received_at": now,
        "next_attempt_at": now,
        "processed_at": None,
        "last_error": None,
        "content_type": None,
        "headers": {},
        "attempts": [],
    }
    return MessageDetail.model_validate({**base, **fields})


def test_a_body_is_indented_json_text_or_base64() -> None:
    as_json = views.body(detail(payload={"a": [1, "<b>"]}, content_type="application/json"))
    as_text = views.body(detail(body_base64=base64.b64encode("héllo <b>".encode()).decode()))
    raw = bytes(range(256)) * 2
    as_binary = views.body(detail(body_base64=base64.b64encode(raw).decode()))
    assert (as_json.kind, as_json.text) == ("json", '{\n  "a": [\n    1,\n    "<b>"\n  ]\n}')
    assert (as_text.kind, as_text.text, as_text.size) == ("text", "héllo <b>", 10)
    assert as_binary.kind == "binary"
    assert as_binary.size == 512
    assert all(len(line) <= 76 for line in as_binary.text.splitlines())
    assert base64.b64decode(as_binary.text.replace("\n", "")) == raw


def test_url_filters_drop_blanks_and_unknown_keys_and_repeat_statuses() -> None:
    pairs = [("source", "hooks"), ("event_type", " "), ("status", "dead"), ("x", "1")]
    pairs.append(("status", "retrying"))
    items = views.query_items(pairs, views.FILTER_KEYS)
    assert items == [("source", "hooks"), ("status", "dead"), ("status", "retrying")]
    query, problems = views.parse_query(MessageQuery, items)
    assert problems == []
    assert query is not None
    assert query.status == ["dead", "retrying"]
    assert views.url("/console/messages", items) == (
        "/console/messages?source=hooks&status=dead&status=retrying"
    )
    # What a browser's datetime-local field sends: no seconds, no offset (read as UTC).
    local, _ = views.parse_query(MessageQuery, [("received_after", "2026-12-01T03:55")])
    assert local is not None
    assert local.received_after == datetime(2026, 12, 1, 3, 55, tzinfo=UTC)
    bad, problems = views.parse_query(MessageQuery, [("limit", "0"), ("received_after", "soon")])
    assert bad is None
    assert [p.split(":")[0] for p in problems] == ["limit", "received after"]


def test_a_character_set_in_the_event_type_glob_is_explained_in_words() -> None:
    bad, problems = views.parse_query(MessageQuery, [("event_type", "charge.[cr]*")])
    assert bad is None
    assert problems == [
        "event type: `*` and `?` are the wildcards here; character sets ([...]) are not"
    ]
    glob, problems = views.parse_query(MessageQuery, [("event_type", "charge.*")])
    assert glob is not None
    assert glob.event_type == "charge.*"
