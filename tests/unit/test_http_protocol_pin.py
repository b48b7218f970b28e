"""The bounded HTTP protocol leans on uvicorn internals: the pinned range is the tested one."""

from __future__ import annotations

import inspect
import tomllib
from pathlib import Path

import uvicorn
import uvicorn.server
from packaging.requirements import Requirement
from starlette.responses import Response
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from service.api.http_protocol import BoundedHttpToolsProtocol, response_bytes

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


def test_uvicorn_replaces_its_default_headers_list_rather_than_changing_it() -> None:
    # response_bytes remembers the lines of the last list it was given, by the list's identity.
    source = inspect.getsource(uvicorn.server)
    assert "self.server_state.default_headers = date_header + " in source
    for changes_in_place in (".default_headers.append", ".default_headers[", ".default_headers +="):
        assert changes_in_place not in source


def test_a_direct_answer_carries_the_default_headers_it_is_given_each_time() -> None:
    response = Response(b'{"status":"accepted"}', media_type="application/json")
    for second in range(3):
        date = f"Fri, 04 Dec 2026 22:00:0{second} GMT".encode()
        default_headers = [(b"date", date), (b"server", b"uvicorn")]
        for keep_alive in (True, False):
            answer = response_bytes(response, "rid-1", default_headers, keep_alive=keep_alive)
            assert answer == (
                b"HTTP/1.1 200 OK\r\n"
                + b"date: "
                + date
                + b"\r\nserver: uvicorn\r\n"
                + b"content-length: 21\r\ncontent-type: application/json\r\n"
                + b"x-request-id: rid-1\r\n"
                + (b"" if keep_alive else b"connection: close\r\n")
                + b'\r\n{"status":"accepted"}'
            )
