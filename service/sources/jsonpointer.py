"""RFC 6901 JSON Pointer lookup, for sources configured with `*_json_pointer` keys."""

from __future__ import annotations

from typing import Any

_MISSING = object()


def validate_pointer(pointer: str) -> str:
    """Refuse a pointer that cannot be evaluated (it must be empty or start with `/`)."""
    if pointer and not pointer.startswith("/"):
        raise ValueError("a JSON pointer starts with '/', as in /data/id")
    return pointer


def resolve_pointer(document: Any, pointer: str) -> Any:
    """The value at `pointer` in `document`, or None where the path does not exist."""
    if pointer == "":
        return document
    current = document
    for raw in pointer[1:].split("/"):
        token = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(current, dict):
            current = current.get(token, _MISSING)
        elif isinstance(current, list) and token.isdigit() and (token == "0" or token[0] != "0"):
            index = int(token)
            current = current[index] if index < len(current) else _MISSING
        else:
            return None
        if current is _MISSING:
            return None
    return current
