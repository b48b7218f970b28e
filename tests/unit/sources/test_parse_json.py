"""parse_json takes jiter's parse when jiter accepts a body, else the stdlib's strict parse: it
must accept exactly what the stdlib parse accepts, with the same values, and refuse the rest
with the stdlib parse's reasons."""

from __future__ import annotations

import json
import math
from typing import Any

import jiter
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from service.sources.base import BadDelivery, parse_json


def _reference_hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    parsed = dict(pairs)
    if len(parsed) != len(pairs):
        raise ValueError("duplicate key")
    return parsed


def reference(body: bytes) -> Any:
    """The strict parse on its own: the stdlib with a duplicate-key hook."""
    text = body.decode("utf-8")
    if text.startswith("\ufeff"):
        raise ValueError("byte order mark")
    return json.JSONDecoder(object_pairs_hook=_reference_hook).decode(text)


def same(a: Any, b: Any) -> bool:
    """Equal values of equal types, key order included; NaN equals NaN, -0.0 is not 0.0."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or (
            a == b and math.copysign(1, a) == math.copysign(1, b)
        )
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


NUMBERS = ["0", "-0", "-0.0", "1e400", "-1e400", "4.9e-324", "2.2250738585072014e-308"]
NUMBERS += ["1.7976931348623157e308", "123456789012345678901234567890", "1E-5", "1.0e+2"]
NUMBERS += ["NaN", "Infinity", "-Infinity", "01", ".5", "1.", "+1", "-"]
STRINGS = ['""', '"a"', '"\\u0061"', '"\\ud800"', '"\\udc00"', '"\\ud83d\\ude00"', '"\\/"']
STRINGS += ['"\\u00e9"', '"é"', '"\x7f"', '"\t"', '"\\x"', '"a\\u0000"']
KEYS = ['"a"', '"b"', '"\\u0061"', '""', '"é"', '"\\ud800"']
SPACE = st.sampled_from(["", " ", "\t", "\n", "\r", "\x0b", "\x0c", "\xa0"])

atoms = st.sampled_from([*NUMBERS, *STRINGS, "true", "false", "null"])
documents = st.recursive(
    atoms,
    lambda inner: (
        st.lists(inner, max_size=3).map(lambda items: f"[{','.join(items)}]")
        | st.lists(st.tuples(st.sampled_from(KEYS), inner), max_size=3).map(
            lambda pairs: "{" + ",".join(f"{key}:{value}" for key, value in pairs) + "}"
        )
    ),
    max_leaves=8,
)


@st.composite
def bodies(draw: st.DrawFn) -> bytes:
    text = draw(SPACE) + draw(documents) + draw(SPACE)
    body = bytearray(text.encode("utf-8", "surrogatepass"))
    for _ in range(draw(st.integers(0, 2))):  # and a mutation or two
        if not body:
            break
        at = draw(st.integers(0, len(body) - 1))
        if draw(st.booleans()):
            del body[at]
        else:
            body.insert(at, draw(st.sampled_from(b' \t,:[]{}"\\0eE.-+\xff\xc3\xed\x00\x0b')))
    return bytes(body)


@settings(max_examples=3000, deadline=None)
@given(body=bodies())
@example(body=b'{"a": 1, "\\u0061": 2}')
@example(body=b'"\\ud800"')
@example(body=b"\xef\xbb\xbf{}")
@example(body=b"[" * 300 + b"]" * 300)
def test_parse_json_accepts_and_refuses_as_the_strict_stdlib_parse(body: bytes) -> None:
    try:
        expected = reference(body)
    except (ValueError, RecursionError):
        with pytest.raises(BadDelivery):
            parse_json(body)
        return
    assert same(parse_json(body), expected)


@pytest.mark.parametrize(
    ("body", "value", "jiter_says"),
    [
        # an escaped lone surrogate: jiter refuses it, the stdlib keeps it
        (b'"\\ud800"', "\ud800", "hex escape"),
        (b"[" * 300 + b"]" * 300, None, "recursion limit"),  # nesting past jiter's 200
    ],
)
def test_what_jiter_refuses_is_still_parsed_by_the_stdlib(
    body: bytes, value: Any, jiter_says: str
) -> None:
    with pytest.raises(ValueError, match=jiter_says):
        jiter.from_json(body, catch_duplicate_keys=True)
    parsed = parse_json(body)
    if value is not None:
        assert parsed == value
    else:
        for _ in range(300):
            assert isinstance(parsed, list)
            parsed = parsed[0] if parsed else None


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b'{"a": 1, "a": 2}', "duplicate key"),
        (b'{"x": {"a": 1, "\\u0061": 2}}', "duplicate key"),  # the same key, escaped
        (b'{"a": "\xff"}', "not valid UTF-8"),
        (b"\xef\xbb\xbf{}", "byte order mark"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (b'{"a": 1} x', "not valid JSON"),
    ],
)
def test_refusals_keep_the_strict_parses_reasons(body: bytes, reason: str) -> None:
    with pytest.raises(BadDelivery, match=reason):
        parse_json(body)
