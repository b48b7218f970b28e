"""`send`'s deliveries: accepted by the real ingest path for every kind it signs, and by the
providers' own libraries where they publish one; the same id twice is a duplicate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import standardwebhooks
import stripe

from service.commands.deliveries import CannotBuild, Wanted, build_delivery
from service.sources.config_file import parse_inbox_config
from tests.admin_seed import AUTH, TOKEN
from tests.cli_runner import run_cli
from tests.conftest import AppFactory
from tests.send_sources import (
    SENDABLE,
    STRIPE_SECRET,
    UNSENDABLE,
    WHSEC,
    sources_config,
)

SOURCES = parse_inbox_config(sources_config()).sources


@pytest.mark.parametrize("name", sorted(SENDABLE))
async def test_a_delivery_of_every_kind_is_accepted_then_a_duplicate(
    name: str, client_for: AppFactory
) -> None:
    source = SOURCES[name]
    wanted = Wanted(message_id=f"send-{name}-1", event_type=SENDABLE[name])
    async with client_for(sources_config(), admin_tokens=[TOKEN]) as client:
        answers = []
        for _ in range(2):
            delivery = build_delivery(source, wanted)  # signed afresh, as a redelivery is
            response = await client.post(
                f"/webhooks/{name}",
                content=delivery.body,
                headers=delivery.headers,
                params=delivery.query,
            )
            assert response.status_code == 200, response.text
            answers.append(response.json())
        listed = await client.get("/admin/messages", params={"source": name}, headers=AUTH)
    outcomes = [outcome(a) for a in answers]
    assert outcomes == ["accepted", "duplicate"]
    (row,) = listed.json()["items"]
    assert row["message_id"] == delivery.message_id
    assert row["receive_count"] == 2
    assert row["event_type"] == SENDABLE[name]


def outcome(answer: dict[str, object]) -> object:
    if "results" in answer:  # Event Grid answers a batch
        (result,) = answer["results"]  # type: ignore[misc]
        return result["status"]  # type: ignore[index]
    return answer.get("outcome", answer.get("status"))  # Dapr says SUCCESS, with the outcome


async def test_defaults_make_a_new_message_each_time(client_for: AppFactory) -> None:
    async with client_for(sources_config()) as client:
        for name in [*SENDABLE, "generic-sha"]:
            ids = set()
            for _ in range(2):
                delivery = build_delivery(SOURCES[name], Wanted())
                response = await client.post(
                    f"/webhooks/{name}",
                    content=delivery.body,
                    headers=delivery.headers,
                    params=delivery.query,
                )
                assert response.status_code == 200, (name, response.text)
                assert outcome(response.json()) == "accepted", name
                ids.add(delivery.message_id)
            assert len(ids) == 2


async def test_a_file_is_sent_as_it_is_unless_a_field_must_be_set(
    client_for: AppFactory,
) -> None:
    raw = b'{"id": "evt_from_file", "object": "event", "type": "charge.refunded"}\n'
    kept = build_delivery(SOURCES["stripe"], Wanted(payload=json.loads(raw), raw=raw))
    assert kept.body == raw
    assert kept.message_id == "evt_from_file"
    changed = build_delivery(
        SOURCES["stripe"], Wanted(payload=json.loads(raw), raw=raw, message_id="evt_2")
    )
    assert json.loads(changed.body)["id"] == "evt_2"
    assert json.loads(changed.body)["type"] == "charge.refunded"


def test_stripe_and_standard_webhooks_libraries_accept_what_send_signs() -> None:
    delivery = build_delivery(SOURCES["stripe"], Wanted(message_id="evt_lib"))
    event = stripe.Webhook.construct_event(
        delivery.body.decode(), delivery.headers["Stripe-Signature"], STRIPE_SECRET
    )
    assert event["id"] == "evt_lib"

    delivery = build_delivery(SOURCES["standard"], Wanted(message_id="msg_lib"))
    verified = standardwebhooks.Webhook(WHSEC).verify(delivery.body, delivery.headers)
    assert verified["type"] == "test.event"


@pytest.mark.parametrize(("name", "reason"), sorted(UNSENDABLE.items()))
def test_kinds_only_their_provider_can_sign_are_refused_with_a_reason(
    name: str, reason: str
) -> None:
    with pytest.raises(CannotBuild, match=reason):
        build_delivery(SOURCES[name], Wanted())


@pytest.mark.parametrize(
    ("name", "wanted", "reason"),
    [
        ("generic-sha", Wanted(message_id="x"), "--id cannot choose it"),
        ("shopify", Wanted(payload=[1, 2], raw=b"[1, 2]"), "must hold a JSON object"),
    ],
)
def test_options_a_source_cannot_honour_are_refused(name: str, wanted: Wanted, reason: str) -> None:
    with pytest.raises(CannotBuild, match=reason):
        build_delivery(SOURCES[name], wanted)


def test_without_a_sources_file_send_says_which_one_make_run_serves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    ran = run_cli("send", "demo")
    assert ran.status == 2
    assert "there is no inbox.toml here and INBOX_CONFIG is unset" in ran.err
    assert "INBOX_CONFIG=inbox.example.toml" in ran.err
