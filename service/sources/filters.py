"""Payload filters: which messages a handler entry (later, a destination) wants, by what the
body says. Written in the sources file, checked against the parsed body, and never raising:
a comparison on a missing field is false (`exists = false` true), one on a value of another
type false, and a body that is not JSON passes no filter.

Two forms, both optional, all of which must hold:

- `contains`: the body contains this JSON, as PostgreSQL's `jsonb @>` says (an object
  contains each key given, with a value that contains the one given; an array contains each
  element given somewhere in it; a scalar contains only itself, and a top-level array a
  scalar among its elements).
- `where`: comparisons on one JSON pointer each (RFC 6901, `/data/object/customer`):
  `equals` a value, `in` a list of values, `exists` (true or false), `prefix` of a string.

JSON's own equality throughout: `true` is not `1`, `1` is `1.0`, and a string is never a
number.
"""

from __future__ import annotations

from typing import Annotated, Any, Self

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PrivateAttr, model_validator

COMPARISONS = ("equals", "in", "exists", "prefix")


def check_pointer(value: str) -> str:
    """A JSON pointer: empty (the whole body) or `/`-separated tokens, `~0` and `~1` escaped."""
    if value and not value.startswith("/"):
        raise ValueError(f"a JSON pointer starts with '/', as in /data/object/id, not {value!r}")
    for token in value.split("/")[1:]:
        if "~" in token.replace("~0", "").replace("~1", ""):
            raise ValueError(f"{value!r}: '~' is written ~0 in a JSON pointer, '/' ~1")
    return value


JsonPointer = Annotated[str, AfterValidator(check_pointer)]


def pointer_tokens(pointer: str) -> tuple[str, ...]:
    return tuple(t.replace("~1", "/").replace("~0", "~") for t in pointer.split("/")[1:])


# What `resolve` answers for a pointer that names nothing (`None` is JSON's null).
MISSING: Any = object()


def resolve(document: Any, tokens: tuple[str, ...]) -> Any:
    """The value `tokens` point at in `document`, or MISSING."""
    for token in tokens:
        if isinstance(document, dict):
            if token not in document:
                return MISSING
            document = document[token]
        elif isinstance(document, list):
            # RFC 6901: a decimal index without leading zeros (and "-", past the end: none).
            if not token.isdigit() or (token != "0" and token.startswith("0")):
                return MISSING
            index = int(token)
            if index >= len(document):
                return MISSING
            document = document[index]
        else:
            return MISSING
    return document


def json_equal(left: Any, right: Any) -> bool:
    """Equality as JSON has it: booleans apart from numbers, numbers by value."""
    if isinstance(left, bool) or isinstance(right, bool):
        return isinstance(left, bool) and isinstance(right, bool) and left == right
    if isinstance(left, int | float) and isinstance(right, int | float):
        return left == right
    if isinstance(left, dict) and isinstance(right, dict):
        return left.keys() == right.keys() and all(json_equal(left[k], right[k]) for k in left)
    if isinstance(left, list) and isinstance(right, list):
        return len(left) == len(right) and all(map(json_equal, left, right))
    return type(left) is type(right) and bool(left == right)


def json_contains(document: Any, wanted: Any, *, top: bool = True) -> bool:
    """`document @> wanted`, as PostgreSQL's jsonb containment."""
    if isinstance(wanted, dict):
        return isinstance(document, dict) and all(
            key in document and json_contains(document[key], value, top=False)
            for key, value in wanted.items()
        )
    if isinstance(wanted, list):
        return isinstance(document, list) and all(
            any(json_contains(element, item, top=False) for element in document) for item in wanted
        )
    if top and isinstance(document, list):  # '["a", "b"]' @> '"a"': the one exception
        return any(json_equal(element, wanted) for element in document)
    return json_equal(document, wanted)


class Condition(BaseModel):
    """One `where` entry: a pointer and exactly one comparison."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    pointer: JsonPointer
    equals: Any = None
    in_: list[Any] | None = Field(default=None, alias="in", min_length=1)
    exists: bool | None = None
    prefix: str | None = None
    # The pointer's tokens, unescaped once here rather than on every message.
    _tokens: tuple[str, ...] = PrivateAttr()

    def model_post_init(self, context: Any) -> None:
        self._tokens = pointer_tokens(self.pointer)

    @model_validator(mode="after")
    def one_comparison(self) -> Self:
        given = [name for name in COMPARISONS if _given(self, name)]
        if len(given) != 1:
            shown = ", ".join(given) if given else "none"
            raise ValueError(f"give exactly one of {', '.join(COMPARISONS)} (given: {shown})")
        return self

    def holds(self, document: Any) -> bool:
        value = resolve(document, self._tokens)
        if self.exists is not None:
            return (value is not MISSING) is self.exists
        if value is MISSING:
            return False
        if self.prefix is not None:
            return isinstance(value, str) and value.startswith(self.prefix)
        if self.in_ is not None:
            return any(json_equal(value, choice) for choice in self.in_)
        return json_equal(value, self.equals)


def _given(condition: Condition, name: str) -> bool:
    field = "in_" if name == "in" else name
    return field in condition.model_fields_set


class PayloadFilter(BaseModel):
    """`payload = { contains = {...}, where = [...] }`: every part given must hold."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    contains: Any = None
    where: list[Condition] = Field(default_factory=list)

    @model_validator(mode="after")
    def says_something(self) -> Self:
        if "contains" not in self.model_fields_set and not self.where:
            raise ValueError("give contains, where, or both")
        return self

    def matches(self, document: Any) -> bool:
        """Whether the parsed body (MISSING when it is not JSON) passes; never raises."""
        if document is MISSING:
            return False
        if "contains" in self.model_fields_set and not json_contains(document, self.contains):
            return False
        return all(condition.holds(document) for condition in self.where)
