"""Which named destinations each message goes to (issue 51): by each destination's event-type
globs and payload filter, and within a handler destination by its handlers' own; a filter
naming a field the body lacks matches nothing and never raises; a destinations table written
wrong stops start-up with one line naming its key."""

from __future__ import annotations

import json
from typing import Any

import pytest

from service.core.settings import ConfigError
from service.processing.pipeline import Pipeline, resolve_pipelines
from service.sources.config_file import parse_inbox_config
from tests.processing_helpers import source

DESTINATIONS: dict[str, Any] = {
    "billing": {
        "event_types": ["invoice.*", "charge.*"],
        "handlers": ["tests.handlers:record_billing"],
    },
    "disputes": {"event_types": ["charge.dispute.*"], "handlers": ["tests.handlers:record"]},
    "euro": {  # a forward for euro amounts of any event
        "payload": {"where": [{"pointer": "/data/object/currency", "in": ["eur"]}]},
        "forward": {"url": "http://127.0.0.1:9/euro"},
    },
    "live": {
        "payload": {"contains": {"livemode": True}},
        "handlers": ["tests.handlers:record_warehouse"],
    },
    "ops": {  # every type, but its one handler takes customers of the ops team only
        "handler": [
            {
                "target": "tests.handlers:record",
                "event_types": ["customer.*"],
                "payload": {"where": [{"pointer": "/data/object/email", "prefix": "ops@"}]},
            }
        ]
    },
    "warehouse": {"handlers": ["tests.handlers:record_warehouse"]},
}


def pipeline(destinations: dict[str, Any] = DESTINATIONS) -> Pipeline:
    inbox = parse_inbox_config({"sources": {"hooks": source(destinations=destinations)}})
    return resolve_pipelines(inbox)["hooks"]


def obj(**fields: Any) -> dict[str, Any]:
    return {"data": {"object": fields}}


CASES: list[tuple[str | None, Any, set[str]]] = [
    ("invoice.paid", obj(currency="usd"), {"billing", "warehouse"}),
    ("invoice.paid", obj(currency="eur"), {"billing", "euro", "warehouse"}),
    (
        "invoice.paid",
        {**obj(currency="eur"), "livemode": True},
        {"billing", "euro", "live", "warehouse"},
    ),
    ("charge.succeeded", obj(currency="chf"), {"billing", "warehouse"}),
    ("charge.dispute.created", obj(currency="usd"), {"billing", "disputes", "warehouse"}),
    ("charge.dispute.closed", obj(currency="eur"), {"billing", "disputes", "euro", "warehouse"}),
    ("charge.refund.updated", {}, {"billing", "warehouse"}),
    ("customer.created", obj(email="ops@example.com"), {"ops", "warehouse"}),
    ("customer.updated", obj(email="dev@example.com"), {"warehouse"}),
    ("customer.created", obj(email=7), {"warehouse"}),  # not a string: no prefix
    ("customer.created", {"data": []}, {"warehouse"}),  # the pointer meets an array
    ("customer.deleted", {"livemode": True}, {"live", "warehouse"}),
    ("payout.paid", {"livemode": False}, {"warehouse"}),
    ("payout.paid", {"livemode": "true"}, {"warehouse"}),  # a string is not true
    ("payout.paid", obj(currency=["eur"]), {"warehouse"}),  # an array is not in ["eur"]
    ("payout.paid", [1, 2, 3], {"warehouse"}),  # a body that is no object
    ("payout.paid", "eur", {"warehouse"}),
    (None, obj(currency="eur"), {"euro", "warehouse"}),  # no event type: only `*` globs
    ("Invoice.paid", obj(), {"warehouse"}),  # globs are case-sensitive
    ("invoice", obj(), {"warehouse"}),
]


@pytest.mark.parametrize(("event_type", "body", "expected"), CASES)
def test_each_message_goes_to_exactly_the_destinations_its_filters_pass(
    event_type: str | None, body: Any, expected: set[str]
) -> None:
    runs = pipeline().runs_for_message(event_type, json.dumps(body).encode())
    assert {run.destination.name for run in runs} == expected
    # In configuration order, each once.
    names = [run.destination.name for run in runs]
    assert names == [name for name in DESTINATIONS if name in expected]


def test_a_body_that_is_not_json_passes_no_payload_filter_and_raises_nothing() -> None:
    runs = pipeline().runs_for_message("invoice.paid", b"\xff not json {")
    assert {run.destination.name for run in runs} == {"billing", "warehouse"}


def test_a_handler_destination_runs_only_its_handlers_that_match() -> None:
    (ops, _) = pipeline().runs_for_message(
        "customer.created", json.dumps(obj(email="ops@x")).encode()
    )
    assert ops.destination.name == "ops"
    assert len(ops.handlers) == 1


@pytest.mark.parametrize(
    ("destinations", "extra", "error"),
    [
        (
            {"both": {"handlers": ["tests.handlers:record"], "forward": {"url": "http://x"}}},
            {},
            "sources.hooks.destinations.both: a destination either forwards or runs",
        ),
        ({"empty": {}}, {}, "sources.hooks.destinations.empty: a destination needs"),
        (
            {"billing": {"handlers": ["tests.handlers:record"]}},
            {"handlers": ["tests.handlers:record"]},
            "sources.hooks.destinations: a source names its destinations or has handlers",
        ),
        (
            {"billing": {"handlers": ["tests.handlers:record"]}},
            {"mode": "sync"},
            "sources.hooks.mode: sync mode",
        ),
        (
            {"billing": {"handlers": ["tests.handlers:nowhere"]}},
            {},
            "sources.hooks.destinations.billing.handlers[0]: module 'tests.handlers' has no",
        ),
    ],
)
def test_destinations_written_wrong_stop_start_up_naming_the_key(
    destinations: dict[str, Any], extra: dict[str, Any], error: str
) -> None:
    config = source(destinations=destinations, **extra)
    if "handlers" not in extra:
        config["handlers"] = []
    with pytest.raises(ConfigError) as raised:
        resolve_pipelines(parse_inbox_config({"sources": {"hooks": config}}))
    assert str(raised.value).startswith(error), str(raised.value)


def test_a_destination_name_is_lowercase_letters_digits_dashes_and_underscores() -> None:
    with pytest.raises(ConfigError) as raised:
        parse_inbox_config(
            {"sources": {"hooks": source(destinations={"Billing Team": {"handlers": []}})}}
        )
    assert "destinations" in str(raised.value)
