"""JSON pointers (RFC 6901) as the generic kind's `*_json_pointer` keys read them."""

from __future__ import annotations

import pytest

from service.sources.jsonpointer import resolve_pointer, validate_pointer

# RFC 6901, section 5.
RFC_DOCUMENT = {
    "foo": ["bar", "baz"],
    "": 0,
    "a/b": 1,
    "c%d": 2,
    "e^f": 3,
    "g|h": 4,
    "i\\j": 5,
    'k"l': 6,
    " ": 7,
    "m~n": 8,
}


@pytest.mark.parametrize(
    ("pointer", "value"),
    [
        ("", RFC_DOCUMENT),
        ("/foo", ["bar", "baz"]),
        ("/foo/0", "bar"),
        ("/", 0),
        ("/a~1b", 1),
        ("/c%d", 2),
        ("/e^f", 3),
        ("/g|h", 4),
        ("/i\\j", 5),
        ('/k"l', 6),
        ("/ ", 7),
        ("/m~0n", 8),
    ],
)
def test_the_rfc_examples(pointer: str, value: object) -> None:
    assert resolve_pointer(RFC_DOCUMENT, validate_pointer(pointer)) == value


@pytest.mark.parametrize(
    "pointer", ["/missing", "/foo/2", "/foo/-", "/foo/01", "/foo/x", "/foo/0/deeper", "/a~1b/c"]
)
def test_a_path_that_does_not_exist_is_none(pointer: str) -> None:
    assert resolve_pointer(RFC_DOCUMENT, pointer) is None


def test_a_scalar_or_string_document_has_no_members() -> None:
    assert resolve_pointer("text", "/0") is None
    assert resolve_pointer(5, "/id") is None


@pytest.mark.parametrize(
    ("pointer", "message"), [("id", "starts with '/'"), ("/a~2", "not a JSON pointer")]
)
def test_a_pointer_that_cannot_be_evaluated_is_refused(pointer: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        validate_pointer(pointer)
