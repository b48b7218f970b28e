"""`/readyz` reads the supervisor's state: not ready while no processing process is alive."""

from __future__ import annotations

import json
from pathlib import Path

from service.app import create_app
from service.core.settings import Settings
from service.sources.config_file import parse_inbox_config
from tests.conftest import running


async def test_readyz_is_not_ready_while_no_processing_process_is_alive(
    database_url: str, tmp_path: Path
) -> None:
    state = tmp_path / "children.json"
    settings = Settings(database_url=database_url, data_dir=tmp_path / "data")
    app = create_app(settings, parse_inbox_config({}), processing_state=state)
    async with running(app) as client:
        state.write_text(json.dumps({"processing_expected": 1, "processing_alive": 0}))
        down = await client.get("/readyz")
        assert down.status_code == 503
        assert down.headers["retry-after"] == "5"
        assert "no processing process is alive" in down.json()["detail"]
        state.write_text(json.dumps({"processing_expected": 1, "processing_alive": 1}))
        assert (await client.get("/readyz")).status_code == 200
        # `serve --no-worker`: none expected, so none missing.
        state.write_text(json.dumps({"processing_expected": 0, "processing_alive": 0}))
        assert (await client.get("/readyz")).status_code == 200
