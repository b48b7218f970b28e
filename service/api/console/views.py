"""What the console's templates show, worked out from the admin API's documents: the chart's
geometry, a message body fit to read, filters read from the URL, times and ages for people."""

from __future__ import annotations

import json
from base64 import b64decode
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal, TypeVar
from urllib.parse import urlencode

from pydantic import BaseModel, ValidationError

from service.api.admin.models import MessageDetail, MinuteActivity

Model = TypeVar("Model", bound=BaseModel)
QueryItems = Sequence[tuple[str, str]]

# The search filters (docs/search.md), by the admin API's names.
SEARCH_KEYS = ("q", "id_prefix", "contains", "where", "header")
# The listing filters a console URL may carry (the admin API's names), then paging.
FILTER_KEYS = (
    "source",
    "status",
    "event_type",
    "message_id",
    "error_type",
    "received_after",
    "received_before",
    *SEARCH_KEYS,
)
PAGING_KEYS = ("cursor", "limit")
# The filters that repeat in a URL, as they do in the API's query string: a list each.
REPEATED_KEYS = frozenset({"status", "where", "header"})


def when(value: datetime | None) -> str:
    if value is None:
        return "—"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def age(seconds: float | None) -> str:
    """A duration as people say it: `42 s`, `5 min`, `3 h 20 min`, `2 d 4 h`."""
    if seconds is None:
        return "—"
    seconds = max(seconds, 0.0)
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes = int(seconds // 60)
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h" if hours else f"{days} d"


def ago(value: datetime | None) -> str:
    if value is None:
        return ""
    return age((datetime.now(UTC) - value).total_seconds()) + " ago"


def duration(ms: float | None) -> str:
    if ms is None:
        return "—"
    return f"{ms:.0f} ms" if ms < 10_000 else f"{ms / 1000:.1f} s"


# ---- the URL's filters -------------------------------------------------------------------


def query_items(pairs: Sequence[tuple[str, str]], keys: Sequence[str]) -> list[tuple[str, str]]:
    """The pairs whose key is one of `keys` and whose value is not blank, in order."""
    return [(k, v.strip()) for k, v in pairs if k in keys and v.strip()]


def parse_query(model: type[Model], items: QueryItems) -> tuple[Model | None, list[str]]:
    """`items` as `model` (the REPEATED_KEYS make lists), or None and what was wrong."""
    data: dict[str, str | list[str]] = {}
    for key, value in items:
        if key in REPEATED_KEYS:
            values = data.setdefault(key, [])
            assert isinstance(values, list)
            values.append(value)
        else:
            data[key] = value
    try:
        return model.model_validate(data), []
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            field = ".".join(str(p) for p in error["loc"][:1]) or "filter"
            message = error["msg"].removeprefix("Value error, ")
            problems.append(f"{field.replace('_', ' ')}: {message}")
        return None, problems


def url(path: str, items: QueryItems = ()) -> str:
    return f"{path}?{urlencode(list(items))}" if items else path


# ---- the overview's chart ----------------------------------------------------------------

WIDTH, HEIGHT = 720, 200
LEFT, RIGHT, TOP, BOTTOM = 44, 12, 12, 28
SERIES = (("received", "Received"), ("processed", "Processed"), ("failed", "Failed"))


@dataclass(frozen=True)
class Series:
    key: str
    label: str
    points: str  # an SVG polyline's `points`
    total: int


@dataclass(frozen=True)
class Tick:
    position: float
    label: str


@dataclass(frozen=True)
class Chart:
    width: int
    height: int
    plot_left: int
    plot_right: int
    plot_top: int
    plot_bottom: int
    series: list[Series]
    y_ticks: list[Tick]
    x_ticks: list[Tick]
    busy_minutes: list[MinuteActivity]  # the minutes with any activity, for the table view


def nice_ceiling(value: int) -> int:
    """The smallest of 1, 2, 5, 10, 20, 50, … that is at least `value`."""
    if value <= 1:
        return 1
    magnitude = int(10 ** (len(str(value)) - 1))
    for step in (1, 2, 5, 10):
        if value <= step * magnitude:
            return step * magnitude
    return 10 * magnitude  # pragma: no cover - the loop always returns


def chart(minutes: Sequence[MinuteActivity]) -> Chart:
    """Lines of received, processed and failed per minute, drawn in a fixed viewBox."""
    left, right, top, bottom = LEFT, WIDTH - RIGHT, TOP, HEIGHT - BOTTOM
    top_value = nice_ceiling(
        max((max(m.received, m.processed, m.failed) for m in minutes), default=0)
    )
    step = (right - left) / max(len(minutes) - 1, 1)

    def y(value: int) -> float:
        return bottom - value / top_value * (bottom - top)

    series = [
        Series(
            key,
            label,
            " ".join(
                f"{left + i * step:.1f},{y(getattr(m, key)):.1f}" for i, m in enumerate(minutes)
            ),
            sum(getattr(m, key) for m in minutes),
        )
        for key, label in SERIES
    ]
    y_values = [0, top_value] if top_value < 2 else [0, top_value // 2, top_value]
    span = len(minutes)
    x_ticks = [Tick(left, f"{span} min ago"), Tick(right, "now")]
    if span >= 4:
        x_ticks.insert(1, Tick(left + (span // 2) * step, f"{span - span // 2} min ago"))
    return Chart(
        WIDTH,
        HEIGHT,
        left,
        right,
        top,
        bottom,
        series,
        [Tick(y(v), str(v)) for v in y_values],
        x_ticks,
        [m for m in minutes if m.received or m.processed or m.failed],
    )


# ---- a message's body --------------------------------------------------------------------


@dataclass(frozen=True)
class Body:
    kind: Literal["json", "text", "binary"]
    text: str  # what to show: indented JSON, the text itself, or base64 lines
    size: int | None  # bytes, when known


def body(detail: MessageDetail) -> Body:
    """JSON indented; any other body as text when it is UTF-8, else as base64. The template
    escapes whatever it is."""
    if detail.body_base64 is None:
        return Body("json", json.dumps(detail.payload, indent=2, ensure_ascii=False), None)
    raw = b64decode(detail.body_base64)
    try:
        return Body("text", raw.decode("utf-8"), len(raw))
    except UnicodeDecodeError:
        lines = [detail.body_base64[i : i + 76] for i in range(0, len(detail.body_base64), 76)]
        return Body("binary", "\n".join(lines), len(raw))


def header_rows(headers: Mapping[str, str]) -> list[tuple[str, str]]:
    return sorted(headers.items())
