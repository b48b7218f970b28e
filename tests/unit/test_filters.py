"""Payload filters on handler entries and destinations: which handlers each message reaches, by
event type and body; a comparison on a field the body lacks is false (`exists = false` true)
and never raises; a filter written wrong stops start-up with one line naming its key."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import pytest

from service.core.settings import ConfigError
from service.processing.pipeline import Pipeline, resolve_pipelines
from service.sources.config_file import parse_inbox_config
from service.sources.filters import MISSING, PayloadFilter, json_contains
from tests.processing_helpers import config, source

ROUTES: list[dict[str, Any]] = [
    {  # euro charges
        "target": "tests.handlers:record",
        "event_types": ["charge.*"],
        "payload": {"contains": {"data": {"object": {"currency": "eur"}}}},
    },
    {  # any event of amount 100 or 200
        "target": "tests.handlers:permanent",
        "payload": {"where": [{"pointer": "/data/object/amount", "in": [100, 200]}]},
    },
    {  # customers of the ops team, not deleted ones
        "target": "tests.handlers:always_fail",
        "event_types": ["customer.*"],
        "payload": {
            "where": [
                {"pointer": "/data/object/email", "prefix": "ops@"},
                {"pointer": "/data/object/deleted", "exists": False},
            ]
        },
    },
    {  # live invoices whose first line is price_1
        "target": "tests.handlers:fail_twice",
        "event_types": ["invoice.paid"],
        "payload": {
            "contains": {"livemode": True},
            "where": [{"pointer": "/data/object/lines/0/price/id", "equals": "price_1"}],
        },
    },
]


def stripe_like(livemode: bool = False, **fields: Any) -> bytes:
    return json.dumps({"livemode": livemode, "data": {"object": fields}}).encode()


def invoice(livemode: Any, *prices: str) -> bytes:
    lines = [{"price": {"id": price}} for price in prices]
    return json.dumps({"livemode": livemode, "data": {"object": {"lines": lines}}}).encode()


CASES: list[tuple[str | None, bytes, set[str]]] = [
    ("charge.succeeded", stripe_like(currency="eur", amount=500), {"record"}),
    ("charge.succeeded", stripe_like(currency="usd", amount=100), {"permanent"}),
    ("charge.succeeded", stripe_like(currency="eur", amount=100), {"record", "permanent"}),
    ("charge.refunded", stripe_like(currency="eur", amount=200), {"record", "permanent"}),
    ("charge.succeeded", stripe_like(currency="eur", metadata={"k": "v"}), {"record"}),
    ("customer.created", stripe_like(email="ops@example.com"), {"always_fail"}),
    ("customer.created", stripe_like(email="ops@example.com", deleted=True), set()),
    ("customer.created", stripe_like(email="dev@example.com"), set()),
    ("customer.updated", stripe_like(email="ops@x.io", amount=100), {"always_fail", "permanent"}),
    ("invoice.paid", invoice(True, "price_1", "price_2"), {"fail_twice"}),
    ("invoice.paid", invoice(False, "price_1"), set()),
    ("invoice.paid", invoice(True, "price_2", "price_1"), set()),
    # Missing fields and other types: no match, nothing raised.
    ("invoice.paid", invoice(True), set()),  # no line 0
    ("invoice.paid", invoice(1, "price_1"), set()),  # 1 is not true
    ("charge.succeeded", stripe_like(currency="usd", amount="100"), set()),  # a string
    ("charge.succeeded", stripe_like(currency="usd", amount=100.0), {"permanent"}),  # 100 == 100.0
    ("charge.succeeded", b"amount=100&currency=eur", set()),  # not JSON
    ("charge.succeeded", b"[1, 2]", set()),  # JSON, not an object
    ("charge.succeeded", json.dumps({"data": "object"}).encode(), set()),  # through a string
    ("customer.created", stripe_like(email=5), set()),  # prefix of a number
    (None, stripe_like(amount=200), {"permanent"}),  # no event type: only "*" entries
]


@pytest.fixture(scope="module")
def pipeline() -> Pipeline:
    return resolve_pipelines(parse_inbox_config(config(handler=ROUTES)))["hooks"]


@pytest.mark.parametrize(("event_type", "body", "expected"), CASES)
def test_each_message_reaches_exactly_the_handlers_whose_filters_it_passes(
    pipeline: Pipeline, event_type: str | None, body: bytes, expected: set[str]
) -> None:
    reached = pipeline.handlers_for_message(event_type, body)
    assert {handler.__name__ for handler in reached} == expected
    assert len(reached) == len(expected)  # each at most once


def test_twenty_combinations_are_covered() -> None:
    assert len(CASES) >= 20
    assert {name for *_, expected in CASES for name in expected} == {
        "record",
        "permanent",
        "always_fail",
        "fail_twice",
    }


def test_without_a_payload_filter_the_body_is_not_read() -> None:
    inbox = parse_inbox_config(config("tests.handlers:record"))
    pipeline = resolve_pipelines(inbox)["hooks"]
    assert not pipeline.reads_payload
    reached = pipeline.handlers_for_message("x", b"\xff not json")
    assert [h.__name__ for h in reached] == ["record"]


def test_a_filter_on_fields_no_body_has_never_raises() -> None:
    where = [
        {"pointer": "", "exists": True},
        {"pointer": "/a/0/b/~0c/~1d", "equals": {"deep": [1, None]}},
        {"pointer": "/a/00", "exists": False},
        {"pointer": "/list/-", "in": [None]},
    ]
    bodies: list[Any] = [MISSING, None, 0, "s", [], {}, {"a": [{"b": {"~c": {}}}]}, [[[]]]]
    for condition in where:
        payload = PayloadFilter.model_validate({"contains": {"a": [{}]}, "where": [condition]})
        for body in bodies:
            assert payload.matches(body) in (True, False)


def test_exists_false_matches_a_body_without_the_field_and_no_body_that_is_not_json() -> None:
    # As docs/routing.md and docs/handlers.md ("Filtering by payload") say.
    raw = {"where": [{"pointer": "/data/gone", "exists": False}]}
    unset = PayloadFilter.model_validate(raw)
    assert unset.matches({"data": {}})
    assert unset.matches({"data": "a string"})  # nothing to point into
    assert unset.matches({})
    assert not unset.matches({"data": {"gone": None}})  # null is there
    assert not unset.matches(MISSING)  # not JSON: no filter passes
    fresh = {"handlers": ["tests.handlers:record"], "payload": raw}
    inbox = parse_inbox_config({"sources": {"hooks": source(destinations={"fresh": fresh})}})
    pipeline = resolve_pipelines(inbox)["hooks"]
    assert [r.destination.name for r in pipeline.runs_for_message("x", b'{"data": {}}')] == [
        "fresh"
    ]
    assert pipeline.runs_for_message("x", b'{"data": {"gone": 1}}') == ()
    assert pipeline.runs_for_message("x", b"gone=1") == ()


def test_containment_of_a_scalar_in_a_top_level_array_only() -> None:
    assert json_contains(["a", "b"], "a")
    assert not json_contains({"k": ["a"]}, {"k": "a"})
    assert json_contains({"k": ["a", "b"]}, {"k": ["b"]})
    assert not json_contains([[1, 2]], [1])
    assert json_contains([1, [2]], [[2]])
    assert not json_contains({"k": 1}, {"k": True})


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (
            {"where": [{"pointer": "data/object", "exists": True}]},
            "sources.hooks.handler[0].payload.where[0].pointer: a JSON pointer starts with '/'",
        ),
        (
            {"where": [{"pointer": "/a~2", "exists": True}]},
            "sources.hooks.handler[0].payload.where[0].pointer: '/a~2': '~' is",
        ),
        (
            {"where": [{"pointer": "/a", "equals": 1, "prefix": "x"}]},
            "sources.hooks.handler[0].payload.where[0]: give exactly one of equals, "
            "in, exists, prefix (given: equals, prefix)",
        ),
        (
            {"where": [{"pointer": "/a"}]},
            "sources.hooks.handler[0].payload.where[0]: give exactly one of",
        ),
        (
            {"where": [{"pointer": "/a", "in": []}]},
            "sources.hooks.handler[0].payload.where[0].in: List should have at least 1 item",
        ),
        ({}, "sources.hooks.handler[0].payload: give contains, where, or both"),
        ({"contain": {"a": 1}}, "sources.hooks.handler[0].payload.contain: unknown key"),
    ],
)
def test_a_filter_written_wrong_is_one_line_naming_its_key(
    payload: dict[str, Any], message: str
) -> None:
    entry = {"target": "tests.handlers:record", "payload": payload}
    with pytest.raises(ConfigError) as raised:
        parse_inbox_config(config(handler=[entry]))
    assert message in str(raised.value)
    assert "\n" not in str(raised.value)


DOCS = Path(__file__).resolve().parents[2] / "docs"


def toml_after(page: str, heading: str) -> dict[str, Any]:
    text = (DOCS / page).read_text().split(heading, 1)[1]
    return tomllib.loads(text.split("```toml\n", 1)[1].split("```", 1)[0])


def test_the_filter_in_the_handlers_page_routes_as_it_says() -> None:
    raw = toml_after("handlers.md", "### Filtering by payload")
    (entry,) = raw["sources"]["payments"]["handler"]
    entry["target"] = "tests.handlers:record"
    pipeline = resolve_pipelines(parse_inbox_config(config(handler=[entry])))["hooks"]
    charge = {"currency": "eur", "amount": 1250, "customer": "cus_9"}
    wanted = json.dumps({"livemode": True, "data": {"object": charge}}).encode()
    assert len(pipeline.handlers_for_message("charge.succeeded", wanted)) == 1
    refunded = {**charge, "refunded": True}
    unwanted = json.dumps({"livemode": True, "data": {"object": refunded}}).encode()
    assert pipeline.handlers_for_message("charge.succeeded", unwanted) == ()


def test_the_error_the_handlers_page_quotes_is_the_one_given() -> None:
    quoted = (DOCS / "handlers.md").read_text().split("`sources.payments.handler[0].payload")[1]
    quoted = "sources.payments.handler[0].payload" + quoted.split("`", 1)[0]
    raw = {"kind": "generic", "token": "t" * 32}
    entry = {
        "target": "tests.handlers:record",
        "payload": {"where": [{"pointer": "data/object", "exists": True}]},
    }
    with pytest.raises(ConfigError) as raised:
        parse_inbox_config({"sources": {"payments": {**raw, "handler": [entry]}}})
    assert str(raised.value) == " ".join(quoted.split())
