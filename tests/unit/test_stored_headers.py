"""The headers ingest stores: every one the request had, as `Headers.items()` decodes them,
with credentials and signatures redacted."""

from starlette.datastructures import Headers

from service.sources.base import REDACTED
from service.sources.config_file import build_source


def test_stored_headers_are_the_requests_with_credentials_redacted() -> None:
    source = build_source("gh", {"kind": "github", "secrets": ["s3cret-s3cret-s3cret"]})
    raw = [
        (b"host", b"example.com"),
        (b"x-hub-signature-256", b"sha256=abc"),
        (b"authorization", b"Bearer t"),
        (b"x-note", b"caf\xe9"),  # latin-1, as HTTP header bytes are read
        (b"x-note", b"second"),  # a repeated name keeps its last value, as a dict of items() did
        (b"x-github-delivery", b"d-1"),
    ]
    kept = source.stored_headers(raw)
    assert kept == {
        "host": "example.com",
        "x-hub-signature-256": REDACTED,
        "authorization": REDACTED,
        "x-note": "second",
        "x-github-delivery": "d-1",
    }
    assert kept == {
        name: (REDACTED if source.is_sensitive_header(name) else value)
        for name, value in Headers(raw=raw).items()
    }


def test_a_latin_1_value_is_stored_as_it_decodes() -> None:
    source = build_source("g", {"kind": "generic", "id_header": "x-message-id"})
    kept = source.stored_headers([(b"x-note", b"caf\xe9")])
    assert kept == {"x-note": "café"}
