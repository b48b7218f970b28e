"""Retention settings: a retention shorter than a source's redelivery window refuses to start."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from service.core.settings import ConfigError
from service.sources.config_file import parse_inbox_config
from tests.cli_runner import refused_at_start


def config(**retention: Any) -> dict[str, Any]:
    return {"sources": {"hooks": {"kind": "generic", "id_header": "X-Id"}}, "retention": retention}


@pytest.mark.parametrize(
    ("retention", "key"),
    [({"processed_days": 2}, "processed_days"), ({"dead_days": 1}, "dead_days")],
)
def test_retention_below_a_source_floor_refuses_to_start(
    retention: dict[str, Any], key: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_inbox_config(config(**retention))
    message = str(raised.value)
    assert message.startswith(f"retention.{key}:")
    assert "'hooks'" in message
    assert "3 days" in message
    assert "redeliver" in message
    assert "\n" not in message


def test_cli_refuses_a_short_retention_with_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    toml = (
        '[sources.hooks]\nkind = "generic"\nid_header = "X-Id"\n\n[retention]\nprocessed_days = 1\n'
    )
    text = refused_at_start(monkeypatch, tmp_path / "inbox.toml", toml, "prune")
    assert text.startswith("config error: ")
    assert "retention.processed_days" in text
    assert "\n" not in text
