"""The bounded HTTP protocol leans on uvicorn internals: the pinned range is the tested one."""

from __future__ import annotations

import inspect
import tomllib
from pathlib import Path

import uvicorn
from packaging.requirements import Requirement
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from service.api.http_protocol import BoundedHttpToolsProtocol

ROOT = Path(__file__).resolve().parents[2]


def test_the_installed_uvicorn_is_in_the_pinned_range() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pinned = next(Requirement(d) for d in project["dependencies"] if d.startswith("uvicorn"))
    assert pinned.specifier.contains(uvicorn.__version__)
    assert any(spec.operator == "<" for spec in pinned.specifier), "an upper bound"


def test_every_uvicorn_method_the_subclass_overrides_still_exists_with_its_signature() -> None:
    ours = {
        name
        for name, member in vars(BoundedHttpToolsProtocol).items()
        if inspect.isfunction(member) and not name.startswith("_")
    }
    theirs = {name for name in ours if hasattr(HttpToolsProtocol, name)}
    assert theirs >= {
        "connection_made",
        "connection_lost",
        "data_received",
        "on_message_begin",
        "on_headers_complete",
        "on_body",
        "on_message_complete",
        "on_response_complete",
    }
    for name in theirs:
        base = inspect.signature(getattr(HttpToolsProtocol, name))
        assert list(inspect.signature(getattr(BoundedHttpToolsProtocol, name)).parameters) == list(
            base.parameters
        ), name
    init = inspect.signature(HttpToolsProtocol.__init__).parameters
    assert list(init) == ["self", "config", "server_state", "app_state", "_loop"]


def test_the_response_completion_the_subclass_copies_is_still_uvicorns() -> None:
    """`on_response_complete` is uvicorn's, less its keep-alive timer: if uvicorn's changes,
    the copy must be looked at again."""
    theirs = inspect.getsource(HttpToolsProtocol.on_response_complete)
    for step in (
        "self.server_state.total_requests += 1",
        "if self.transport.is_closing():",
        "self._unset_keepalive_if_required()",
        "self.flow.resume_reading()",
        "cycle, app = self.pipeline.pop()",
        "self._start_asgi_task(cycle, app)",
        "self.timeout_keep_alive_task = self.loop.call_later(",
    ):
        assert step in theirs, step
    assert theirs.count("self.") == 11, "uvicorn's on_response_complete has changed"
