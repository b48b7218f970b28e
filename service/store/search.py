"""Search: messages found by what they hold, through the indexes of migration 0025.

Four forms, each served by an index, and combined with AND with every other filter of the
listings (`MessageFilter`):

- a prefix of the dedup key (`evt_1Q`), on `message_id text_pattern_ops`;
- the payload: a JSON document it contains (PostgreSQL's `@>`), or conditions on a path
  (`data.object.customer=cus_9`, `!=`, `in`, `exists`) written as JSONPath (`@?`), both on the
  GIN index over `inbox_payload(body)`;
- a header's value, on the GIN index over the stored headers;
- free text: a word the message holds as a value anywhere in its payload (`$.** ? (@ == w)`)
  or as its dedup key.

Each statement of a search reads through its indexes' bitmaps, or walks newest first when
it is known to match many (`bounded`, and `searched_page` in service/store/admin.py, which
chooses); SEARCH_TIMEOUT_MS bounds it, and a search cut short is refused as too broad
(`SearchTooBroad`), never left running.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Literal

import asyncpg
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from service.store.errors import _underlying

# What the payload index is built over (0025): the body as jsonb, NULL when it is not JSON.
PAYLOAD = "inbox_payload(body)"
# The index's predicate: only the payloads of sources with `search_payload` are indexed, and
# only those are searched (written before each payload condition, for the planner to match).
SEARCHABLE = "searchable"

# How long one search statement may run: a listing's page, a count, one batch of an action.
SEARCH_TIMEOUT_MS = 5000

MAX_CONDITIONS = 20
MAX_PATH_SEGMENTS = 32
MAX_VALUES = 100
MAX_DOCUMENT_DEPTH = 32
MAX_DOCUMENT_CHARS = 10_000

Operator = Literal["=", "!=", "in", "exists"]


class SearchError(ValueError):
    """A search the service cannot run as written; the message says what to change."""


class SearchTooBroad(Exception):
    """A search ran past SEARCH_TIMEOUT_MS and was cancelled."""


def check_text(value: str, what: str) -> str:
    """`value`, unless PostgreSQL could not hold it: NUL, or a lone surrogate."""
    if "\x00" in value:
        raise SearchError(f"{what} holds a NUL character, which no message can hold")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise SearchError(f"{what} holds an unpaired surrogate, which is not text") from None
    return value


def check_free_text(value: str) -> str:
    """Free text as a search takes it: text, and something besides spaces."""
    if not check_text(value, "the search text").strip():
        raise SearchError("the search text is only spaces")
    return value.strip()


def jsonpath_string(value: str) -> str:
    """`value` as a JSONPath string literal: JSON's escapes, which JSONPath reads the same."""
    return json.dumps(value, ensure_ascii=True)


# A path: dot-separated keys, each bare (`data`, `line_items`) or a JSON string for a key with
# dots, spaces or quotes (`"x.y"`), each optionally followed by array subscripts (`[0]`).
_QUOTED = r'"(?:[^"\\]|\\.)*"'
_BARE = r"[A-Za-z0-9_$@\-]+"
_SEGMENT = rf"(?:{_QUOTED}|{_BARE})(?:\[\d{{1,6}}\])*"
_PATH = rf"{_SEGMENT}(?:\.{_SEGMENT})*"
_STEP = re.compile(rf"({_QUOTED})|({_BARE})|\[(\d+)\]")
_CONDITION = re.compile(
    rf"""\s*(?P<path>{_PATH})\s*
         (?:(?P<op>!=|=)(?P<value>.*)
           |\s+in\s+(?P<values>.+)
           |\s+(?P<exists>exists))\s*""",
    re.VERBOSE | re.DOTALL,
)
_LIST_ITEM = re.compile(rf"\s*({_QUOTED}|[^,]*?)\s*(?:,|$)")


def parse_path(path: str) -> tuple[str | int, ...]:
    """The keys and array indexes of `path` (`data.object.customer`, `items[0].sku`,
    `"x.y".z`)."""
    if re.fullmatch(_PATH, path) is None:
        raise SearchError(
            f"{path[:60]!r} is not a path: keys of letters, digits, `_` or `-`, or JSON "
            'strings ("x.y"), joined by dots, each maybe followed by [N]'
        )
    steps: list[str | int] = []
    for quoted, bare, index in _STEP.findall(path):
        steps.append(json.loads(quoted) if quoted else bare if bare else int(index))
    if len(steps) > MAX_PATH_SEGMENTS:
        raise SearchError(f"a path has at most {MAX_PATH_SEGMENTS} keys and indexes")
    for step in steps:
        if isinstance(step, str):
            check_text(step, "a key of the path")
    return tuple(steps)


def parse_value(raw: str) -> tuple[Any, ...]:
    """What a written value matches: a JSON string when quoted; otherwise the text as a string,
    and as the number, boolean or null it also reads as (`42` matches 42 and "42")."""
    raw = raw.strip()
    if raw.startswith('"'):
        try:
            value = json.loads(raw)
        except ValueError:
            raise SearchError(f"the value {raw[:40]!r} is not a closed JSON string") from None
        if not isinstance(value, str):
            raise SearchError(f"the value {raw[:40]!r} is not a JSON string")
        return (check_text(value, "the value"),)
    matches: list[Any] = [check_text(raw, "the value")]
    if raw in ("true", "false", "null"):
        matches.append(json.loads(raw))
    elif re.fullmatch(r"-?(0|[1-9]\d{0,15})(\.\d{1,15})?([eE][+-]?\d{1,3})?", raw):
        number = json.loads(raw)
        if number == number and abs(number) != float("inf"):
            matches.append(number)
    return tuple(matches)


def jsonpath_literal(value: Any) -> str:
    if isinstance(value, str):
        return jsonpath_string(value)
    return json.dumps(value)  # a number, true, false or null: written as JSONPath reads them


@dataclass(frozen=True)
class PathCondition:
    """One condition on the payload: `path op value(s)`."""

    path: tuple[str | int, ...]
    op: Operator
    values: tuple[Any, ...] = ()

    def jsonpath(self) -> str:
        """The path as JSONPath (lax: a key on an array reaches into its elements)."""
        steps = "".join(
            f"[{step}]" if isinstance(step, int) else f".{jsonpath_string(step)}"
            for step in self.path
        )
        return f"${steps}"

    def matching(self) -> str:
        """The JSONPath that holds when the path has one of the values."""
        equals = " || ".join(f"@ == {jsonpath_literal(v)}" for v in self.values)
        return f"{self.jsonpath()} ? ({equals})"

    def clause(self, name: str) -> tuple[str, dict[str, str]]:
        """The SQL condition (on PAYLOAD) and its parameters, named after `name`."""
        if self.op == "exists":
            return f"{PAYLOAD} @? CAST(:{name} AS jsonpath)", {name: self.jsonpath()}
        if self.op == "!=":
            # Has the path, and none of its values is this one: the first half is indexed.
            return (
                f"{PAYLOAD} @? CAST(:{name}_has AS jsonpath) "
                f"AND NOT {PAYLOAD} @? CAST(:{name} AS jsonpath)",
                {f"{name}_has": self.jsonpath(), name: self.matching()},
            )
        return f"{PAYLOAD} @? CAST(:{name} AS jsonpath)", {name: self.matching()}

    def written(self) -> str:
        """The condition, canonically: what a cursor is bound to."""
        return f"{self.op} {self.jsonpath()} {json.dumps(self.values)}"


def parse_condition(condition: str) -> PathCondition:
    """`path=value`, `path!=value`, `path in a,b,c` or `path exists`, as `PathCondition`."""
    check_text(condition, "the condition")
    match = _CONDITION.fullmatch(condition)
    if match is None:
        raise SearchError(
            f"{condition[:60]!r} is not a condition: write `path=value`, `path!=value`, "
            "`path in a,b` or `path exists` (e.g. data.object.customer=cus_9)"
        )
    path = parse_path(match.group("path"))
    if match.group("exists"):
        return PathCondition(path, "exists")
    if match.group("values") is not None:
        items = [m.group(1) for m in _LIST_ITEM.finditer(match.group("values")) if m.group(0)]
        if not items or len(items) > MAX_VALUES:
            raise SearchError(f"`in` takes 1 to {MAX_VALUES} values, separated by commas")
        values = tuple(v for item in items for v in parse_value(item))
        return PathCondition(path, "in", values)
    op: Operator = "!=" if match.group("op") == "!=" else "="
    return PathCondition(path, op, parse_value(match.group("value")))


def parse_header(header: str) -> tuple[str, str]:
    """`Name: value` (or `name=value`) as the stored (lowercase) name and the value."""
    check_text(header, "the header")
    name, sep, value = header.partition(":")
    if not sep:
        name, sep, value = header.partition("=")
    name = name.strip().lower()
    if not sep or not re.fullmatch(r"[!#$%&'*+.^_`|~0-9a-z-]+", name):
        raise SearchError(
            f"{header[:60]!r} is not a header: write `Name: value` (e.g. X-Shop-Domain: acme)"
        )
    return name, value.strip()


def depth_of(value: Any) -> int:
    """How deep `value` nests arrays and objects (without recursing)."""
    deepest = 0
    stack = [(value, 1)] if isinstance(value, dict | list) else []
    while stack:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        if depth > MAX_DOCUMENT_DEPTH:
            break
        children = item.values() if isinstance(item, dict) else item
        stack.extend((c, depth + 1) for c in children if isinstance(c, dict | list))
    return deepest


def parse_document(document: str | Any) -> str:
    """A containment document (JSON text, or already parsed from a request body) as canonical
    JSON text."""
    if isinstance(document, str):
        check_text(document, "the document")
        if len(document) > MAX_DOCUMENT_CHARS:
            raise SearchError(f"the document is longer than {MAX_DOCUMENT_CHARS} characters")
        try:
            document = json.loads(document)
        except (ValueError, RecursionError):
            raise SearchError('`contains` is not JSON (e.g. {"data": {"object": …}})') from None
    if depth_of(document) > MAX_DOCUMENT_DEPTH:
        raise SearchError(f"the document nests deeper than {MAX_DOCUMENT_DEPTH} levels")
    try:
        written = json.dumps(document, allow_nan=False, sort_keys=True, separators=(",", ":"))
    except ValueError:
        raise SearchError("the document holds NaN or an infinity, which JSON does not") from None
    if "\\u0000" in written:
        raise SearchError("the document holds a NUL character, which no message can hold")
    if re.search(r"\\ud[89ab][0-9a-f]{2}(?!\\ud[c-f])", written):
        raise SearchError("the document holds an unpaired surrogate, which is not text")
    return written


def prefix_end(prefix: str) -> str | None:
    """Where the keys starting with `prefix` end in `text_pattern_ops` (byte) order, which
    they fill from `prefix` itself: the prefix with its last character incremented (None: no
    end short of the last key)."""
    for cut in range(len(prefix), 0, -1):
        last = ord(prefix[cut - 1]) + 1
        if 0xD800 <= last <= 0xDFFF:
            last = 0xE000
        if last <= 0x10FFFF:
            return prefix[: cut - 1] + chr(last)
    return None


@dataclass(frozen=True)
class Search:
    """What a search asks of a message's contents; each part that is set must hold."""

    id_prefix: str | None = None
    contains: str | None = None  # canonical JSON text (`parse_document`)
    conditions: tuple[PathCondition, ...] = ()
    headers: tuple[tuple[str, str], ...] = ()
    text: str | None = None

    def __bool__(self) -> bool:
        return bool(self.id_prefix or self.contains or self.conditions or self.headers or self.text)

    def where(self) -> tuple[list[str], dict[str, Any]]:
        """SQL conditions over `inbox_messages` (fixed text, values bound) and parameters."""
        clauses: list[str] = []
        params: dict[str, Any] = {}
        if self.id_prefix:
            clauses.append("message_id ~>=~ :id_prefix AND starts_with(message_id, :id_prefix)")
            params["id_prefix"] = self.id_prefix
            end = prefix_end(self.id_prefix)
            if end is not None:
                clauses.append("message_id ~<~ :id_prefix_end")
                params["id_prefix_end"] = end
        if self.contains is not None or self.conditions:
            clauses.append(SEARCHABLE)
        if self.contains is not None:
            clauses.append(f"{PAYLOAD} @> CAST(:contains AS jsonb)")
            params["contains"] = self.contains
        for number, condition in enumerate(self.conditions):
            clause, bound = condition.clause(f"path_{number}")
            clauses.append(clause)
            params |= bound
        for number, (name, value) in enumerate(self.headers):
            clauses.append(f"headers @> CAST(:header_{number} AS jsonb)")
            params[f"header_{number}"] = json.dumps({name: value})
        if self.text:
            anywhere = " || ".join(f"@ == {jsonpath_literal(v)}" for v in parse_value(self.text))
            clauses.append(
                f"(message_id = :text OR ({SEARCHABLE} AND {PAYLOAD} @? CAST(:text_anywhere AS "
                "jsonpath)))"
            )
            params |= {"text": self.text, "text_anywhere": f"$.** ? ({anywhere})"}
        return clauses, params

    def written(self) -> dict[str, Any]:
        """The search as its filters are written, canonically: what a cursor is bound to and
        what the audit records."""
        fields: dict[str, Any] = {
            "id_prefix": self.id_prefix,
            "contains": self.contains,
            "where": [c.written() for c in self.conditions] or None,
            "header": [f"{n}: {v}" for n, v in self.headers] or None,
            "q": self.text,
        }
        return {name: value for name, value in fields.items() if value is not None}


# Conditions the payload index cannot narrow: it has an entry for a key with its value, none
# for a path alone, so `exists` (and `!=`, which is "exists and not") would read every message.
UNINDEXED = frozenset({"exists", "!="})


def check_narrowed(
    conditions: Sequence[PathCondition],
    *,
    q: str | None,
    id_prefix: str | None,
    contains: object,
    header: Sequence[str],
) -> None:
    """Refuse a search whose every part is a condition no index serves (`UNINDEXED`)."""
    if (
        conditions
        and not (q or id_prefix or contains is not None or header)
        and all(c.op in UNINDEXED for c in conditions)
    ):
        raise SearchError(
            "`exists` and `!=` are not served by an index: add a condition that is (`=`, "
            "`in`, `contains`, a header, an id prefix or `q`)"
        )


def build_search(
    *,
    q: str | None = None,
    id_prefix: str | None = None,
    contains: str | Any | None = None,
    where: Sequence[str] = (),
    header: Sequence[str] = (),
) -> Search | None:
    """The search the filters as written ask for, or None when they ask none; `SearchError`
    says what is wrong with one."""
    if len(where) + len(header) > MAX_CONDITIONS:
        raise SearchError(f"a search has at most {MAX_CONDITIONS} conditions and headers")
    search = Search(
        id_prefix=check_text(id_prefix, "the id prefix") if id_prefix else None,
        contains=None if contains is None else parse_document(contains),
        conditions=tuple(parse_condition(c) for c in where),
        headers=tuple(parse_header(h) for h in header),
        text=check_free_text(q) if q else None,
    )
    check_narrowed(search.conditions, q=q, id_prefix=id_prefix, contains=contains, header=header)
    return search if search else None


# How a search's statements are planned (`bounded`). The planner cannot tell how many messages
# a payload condition matches (it assumes 1 % of them, whatever the condition), so which scan
# suits a search is chosen for it:
# - "bitmap": through its indexes' bitmaps only: for a search that matches few (a customer's
#   300 among 3 M), where walking the newest-first index would parse most of the table's bodies
#   before a page is full; for counts and the batches of an action;
# - "walk": through an index in order only: for a search known to match many (a third of the
#   messages), whose matches a walk newest first soon meets, where reading them all through
#   the bitmap would take seconds;
# - "free": as the planner likes (a page of messages known by id).
Plan = Literal["bitmap", "walk", "free"]
# Each setting for the statement's transaction only. No JIT: a plan with a disabled scan costs
# over 10^10, and would be compiled, for half a second each.
BOUND_SEARCH = text(
    """
    SELECT set_config('statement_timeout', :timeout, true), set_config('jit', 'off', true),
           set_config('enable_indexscan', CASE WHEN :plan = 'bitmap' THEN 'off' ELSE 'on' END,
                      true),
           set_config('enable_indexonlyscan',
                      CASE WHEN :plan = 'bitmap' THEN 'off' ELSE 'on' END, true),
           set_config('enable_bitmapscan', CASE WHEN :plan = 'walk' THEN 'off' ELSE 'on' END,
                      true),
           set_config('enable_seqscan', CASE WHEN :plan = 'free' THEN 'on' ELSE 'off' END, true)
    """
)


@asynccontextmanager
async def bounded(
    conn: AsyncConnection,
    search: Search | None,
    *,
    plan: Plan = "bitmap",
    timeout_ms: int | None = None,
) -> AsyncIterator[None]:
    """Run the statements of `conn`'s transaction that may search: with `search`, each is cut
    at `timeout_ms` (SEARCH_TIMEOUT_MS unless given; `SearchTooBroad`) and planned as `plan`
    says (BOUND_SEARCH); without one, as ever."""
    if search is None:
        yield
        return
    timeout = SEARCH_TIMEOUT_MS if timeout_ms is None else timeout_ms
    await conn.execute(BOUND_SEARCH, {"timeout": str(timeout), "plan": plan})
    try:
        yield
    except Exception as exc:
        if _underlying(exc, asyncpg.exceptions.QueryCanceledError) is not None:
            raise SearchTooBroad(
                f"the search ran past {SEARCH_TIMEOUT_MS / 1000:g} s and was stopped: narrow it "
                "with a source, a time range, or a more selective condition"
            ) from None
        if _underlying(exc, asyncpg.exceptions.DataError) is not None:
            line = str(exc).splitlines()[0][:200]
            raise SearchError(f"the database refused the search: {line}") from None
        raise
