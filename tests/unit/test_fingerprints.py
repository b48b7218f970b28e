"""Fingerprints of failed attempts: the same cause gives the same key, whatever the lines."""

from __future__ import annotations

import asyncio
import hashlib
import sysconfig
from pathlib import Path
from typing import Any

from service.processing.fingerprints import (
    endpoint_of,
    fingerprint,
    forward_fingerprint,
    handler_fingerprint,
    status_class,
)
from service.processing.runner import call_handlers
from service.store.results import Fingerprint

APP_FILE = "/srv/app/billing.py"
LIBRARY_FILE = str(Path(sysconfig.get_paths()["purelib"]) / "somelib" / "client.py")

CHARGE = """
def charge(message):
    return lookup(message)

def lookup(message):
    raise LookupError(message)
"""
# The same code, every line moved by an edit above it and inside it.
CHARGE_MOVED = """
# a comment added above


def charge(message):
    note = "unrelated"
    return lookup(message)

def lookup(message):

    raise LookupError(message)
"""
LIBRARY = """
def fetch(message):
    raise ConnectionError(message)

def capture(function, message):
    try:
        wrap(function, message)
    except Exception as exc:
        return exc

def wrap(function, message):
    try:
        function(message)
    except LookupError as exc:
        raise TimeoutError("wrapped") from exc
"""
CALLS_LIBRARY = """
def charge(message):
    return fetch(message)
"""


def module(code: str, name: str, filename: str, **names: Any) -> dict[str, Any]:
    namespace: dict[str, Any] = {"__name__": name, **names}
    exec(compile(code, filename, "exec"), namespace)
    return namespace


def as_handler(function: Any) -> Any:
    async def handler(message: Any, ctx: Any) -> None:
        function(message)

    handler.__module__, handler.__qualname__ = function.__module__, function.__name__
    return handler


def failure_of(handler: Any) -> BaseException:
    try:
        asyncio.run(call_handlers([handler], "m1", None))  # type: ignore[arg-type]
    except Exception as exc:
        return exc
    raise AssertionError("the handler did not fail")


def cause(exc: BaseException, destination: str | None = None) -> Fingerprint:
    return handler_fingerprint(
        exc, "hooks", destination, type(exc).__name__, call_handlers.__code__
    )


async def lookup_fails(message: Any, ctx: Any) -> None:
    raise LookupError(message)


async def value_fails(message: Any, ctx: Any) -> None:
    raise ValueError(message)


async def lookup_fails_too(message: Any, ctx: Any) -> None:
    raise LookupError(message)


def test_two_tracebacks_differing_only_in_line_numbers_have_one_fingerprint() -> None:
    first = module(CHARGE, "app.billing", APP_FILE)
    moved = module(CHARGE_MOVED, "app.billing", APP_FILE)
    one = cause(failure_of(as_handler(first["charge"])))
    other = cause(failure_of(as_handler(moved["charge"])))
    assert one == other
    assert one.frame == "app.billing:lookup"
    assert len(one.key) == 16
    assert int(one.key, 16) >= 0


def test_the_handler_that_raised_and_the_applications_frame_are_named() -> None:
    found = cause(failure_of(lookup_fails))
    assert found.handler == f"{__name__}:lookup_fails"
    assert found.frame == f"{__name__}:lookup_fails"
    assert found.error_type == "LookupError"
    assert (found.source, found.destination, found.detail) == ("hooks", None, None)


def test_another_handler_destination_exception_type_or_frame_is_another_fingerprint() -> None:
    base = cause(failure_of(lookup_fails))
    others = [
        cause(failure_of(lookup_fails_too)),  # another handler (and frame)
        cause(failure_of(lookup_fails), destination="billing"),
        cause(failure_of(value_fails)),
        cause(
            failure_of(as_handler(module(CHARGE, "app.refunds", "/srv/app/refunds.py")["charge"]))
        ),
    ]
    keys = {base.key, *(other.key for other in others)}
    assert len(keys) == 1 + len(others)
    handled = as_handler(module(CHARGE, "app.billing", APP_FILE)["charge"])
    elsewhere = as_handler(module(CHARGE, "app.refunds", "/srv/app/refunds.py")["charge"])
    elsewhere.__module__ = handled.__module__  # one handler name, two application frames
    assert cause(failure_of(handled)).key != cause(failure_of(elsewhere)).key


def test_library_frames_are_skipped_for_the_applications_own() -> None:
    library = module(LIBRARY, "somelib.client", LIBRARY_FILE)
    app = module(CALLS_LIBRARY, "app.billing", APP_FILE, fetch=library["fetch"])
    found = cause(failure_of(as_handler(app["charge"])))
    assert found.frame == "app.billing:charge"


def test_a_failure_without_an_application_frame_has_none() -> None:
    library = module(LIBRARY, "somelib.client", LIBRARY_FILE)
    found = cause(library["capture"](library["fetch"], "m1"))
    assert (found.error_type, found.handler, found.frame) == ("ConnectionError", None, None)


def test_the_frame_is_found_through_the_cause_of_a_wrapping_exception() -> None:
    # As the runner's HandlerTimeout, raised from the handler's error by the inbox's own code.
    library = module(LIBRARY, "somelib.client", LIBRARY_FILE)
    app = module(CHARGE, "app.billing", APP_FILE)
    found = cause(library["capture"](app["charge"], "m1"))
    assert (found.error_type, found.frame) == ("TimeoutError", "app.billing:lookup")


def test_forward_status_classes_and_connection_errors() -> None:
    url = "http://billing.internal/hooks?token=secret"

    def forward(error_type: str, kind: str, where: str = url) -> Fingerprint:
        return forward_fingerprint("hooks", None, error_type, kind, where)

    five_oh_three = forward("ForwardFailed", status_class(503))
    assert five_oh_three == forward("ForwardFailed", status_class(502))
    assert five_oh_three.detail == "5xx billing.internal:80/hooks"
    assert five_oh_three != forward("ForwardFailed", status_class(429))
    assert five_oh_three != forward("ForwardConnectionError", "ConnectError")
    assert five_oh_three != forward("ForwardFailed", "5xx", "http://billing.internal:8080/hooks")
    assert status_class(404) == "4xx"
    assert status_class(429) == "429"
    outbox = forward_fingerprint("outbox:crm", None, "ForwardTimeout", "timeout", url, "crm")
    assert outbox.detail == "timeout crm"


def test_endpoint_of_names_the_default_port_and_drops_the_query() -> None:
    assert endpoint_of("https://example.com") == "example.com:443/"
    assert endpoint_of("http://u:p@10.0.0.1:9000/a/b?x=1") == "10.0.0.1:9000/a/b"


def test_the_key_hashes_the_parts_and_nothing_else() -> None:
    one = fingerprint("hooks", "ValueError", handler="a:b", frame="a:b")
    assert one == fingerprint("hooks", "ValueError", handler="a:b", frame="a:b")
    parts = b'["hooks",null,"a:b","ValueError","a:b",null]'
    assert one.key == hashlib.sha256(parts).hexdigest()[:16]
    # None and an empty string are two parts, not one.
    assert one.key != fingerprint("hooks", "ValueError", handler="a:b", frame="a:b", detail="").key
