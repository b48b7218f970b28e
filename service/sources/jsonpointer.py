"""RFC 6901 JSON Pointer lookup (the `jsonpointer` package), for the `*_json_pointer` keys."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from jsonpointer import EndOfList, JsonPointer, JsonPointerException


@lru_cache(maxsize=1024)
def _compiled(pointer: str) -> JsonPointer:
    # Parsed once per configured pointer, not once per delivery.
    return JsonPointer(pointer)


def validate_pointer(pointer: str) -> str:
    """Refuse a pointer that cannot be evaluated (it must be empty or start with `/`)."""
    if pointer and not pointer.startswith("/"):
        raise ValueError("a JSON pointer starts with '/', as in /data/id")
    try:
        _compiled(pointer)
    except JsonPointerException as exc:
        raise ValueError(f"not a JSON pointer (RFC 6901): {exc}") from None
    return pointer


def resolve_pointer(document: Any, pointer: str) -> Any:
    """The value at `pointer` in `document`, or None where the path does not exist."""
    value = _compiled(pointer).resolve(document, None)
    # `-` names the position past a list's end: no value there.
    return None if isinstance(value, EndOfList) else value
