"""What a source kind is: it authenticates a raw delivery and names the messages inside it."""

from __future__ import annotations

import hashlib
import hmac
import json
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from http import HTTPStatus
from typing import Any, ClassVar, Generic, Literal, TypeVar, get_args, get_origin

import jiter

from service.sources.config import HEADER_PREFIX, SourceConfig, secret_text
from service.sources.jsonpointer import resolve_pointer

# The configuration model of a kind: `Source[GenericConfig]` sees `self.config` as one.
ConfigT = TypeVar("ConfigT", bound=SourceConfig)

# How many header names a source remembers the stored form and sensitivity of
# (`Source.stored_headers`).
MAX_REMEMBERED_HEADERS = 1024

# What a stored header holds in place of a credential's or a signature's value.
REDACTED = "[redacted]"

# Headers whose values are credentials under any kind; never stored or logged.
ALWAYS_SENSITIVE_HEADERS = frozenset(
    {"authorization", "proxy-authorization", "cookie", "set-cookie", "x-api-key"}
)


def raw_header_name(name: str) -> bytes:
    """A header name as a delivery's raw header list holds it (lowercase Latin-1 bytes), for
    `first_header`: each kind makes its own once, not on every delivery."""
    return name.lower().encode("latin-1")


def first_header(raw: Sequence[tuple[bytes, bytes]], name: bytes) -> str | None:
    """The first value of the header `name` (from `raw_header_name`) in `raw`, or None: how
    every kind reads a header. Starlette's `Headers.get` answers the same with more work: it
    goes through `Mapping.get`, encodes the name on every call, and raises and catches a
    KeyError when the header is missing (callgrind, alone: 3,300 instructions a header found,
    7,200 one missing)."""
    for key, value in raw:
        if key == name:
            return value.decode("latin-1")
    return None


class HeaderName:
    """A header a kind reads, by its name as docs and errors spell it (`name`) and as the raw
    header list holds it (`raw`), both made once when the kind is loaded; `where` is where a
    refused value was looked for, as a 400 says it."""

    # Slots: `required` reads `raw` on every delivery, and a slot is the quickest attribute.
    __slots__ = ("name", "raw", "where")

    def __init__(self, name: str) -> None:
        self.name = name
        self.raw = raw_header_name(name)
        self.where = f"the {name} header"

    def required(self, raw: Sequence[tuple[bytes, bytes]]) -> str:
        """The header's first value in `raw`; 401 naming it where it is missing or empty, as
        for a signature or a key. `first_header`'s walk written out, not a call to it: one
        call less on every delivery of a signed kind."""
        name = self.raw
        for key, value in raw:
            if key == name:
                if value:
                    return value.decode("latin-1")
                break
        raise Unauthenticated(f"missing {self.name} header")


def media_type_of(content_type: str) -> str:
    """The media type of a Content-Type value: lowercased, without its parameters."""
    return content_type.split(";", 1)[0].strip().lower()


def is_json_media_type(media: str) -> bool:
    """Whether `media` (from `media_type_of`) is JSON: `application/json` or a `+json` type."""
    return media == "application/json" or media.endswith("+json")


# The classes below that are made for every delivery (`RawDelivery`, `Message`, `Messages`,
# `Recorded`) are not frozen dataclasses: a frozen one sets each field through
# `object.__setattr__`, and for a class of five fields that is 9,300 instructions a call
# against 2,500 for a slotted one (callgrind). Nothing changes them once made (but
# `RawDelivery`'s own cache of its content type).


@dataclass(slots=True)
class RawDelivery:
    """A delivery as it arrived, before anything has parsed its body."""

    method: str
    query: Mapping[str, str]
    body: bytes
    # The headers as they arrived: (lowercase name, value), repeats included, the list the
    # server parsed, not a copy. Read them with `first_header`.
    raw_headers: list[tuple[bytes, bytes]]
    # Read once: ingest checks the content type, then most kinds read it again, and every
    # read is a walk of the header list. Not functools.cached_property: on Python 3.11 its
    # lock costs more than the walk (callgrind: 5,000 instructions a delivery).
    _content_type: str | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def content_type(self) -> str:
        if self._content_type is None:
            self._content_type = first_header(self.raw_headers, b"content-type") or ""
        return self._content_type

    @property
    def media_type(self) -> str:
        return media_type_of(self.content_type)


@dataclass(slots=True)
class Message:
    """One message to record: its dedup key, event type and, for batches, its own bytes."""

    message_id: str
    event_type: str | None = None
    body: bytes | None = None  # None: the whole request body
    content_type: str | None = None  # None: the request's content type
    # The W3C trace context the event itself carries (CloudEvents' distributed-tracing
    # extension, Pub/Sub attributes), {"traceparent": ..., "tracestate": ...}; with tracing on,
    # ingest stores the delivery span's context in its place.
    trace_context: Mapping[str, str] | None = None
    # The source's `ordering_key` of this message (`Source.authenticate`); None: unordered.
    ordering_key: str | None = None


@dataclass(slots=True)
class Messages:
    """A verified delivery carrying messages; `batch` answers with a per-message results list."""

    items: Sequence[Message]
    batch: bool = False


@dataclass(frozen=True)
class Handshake:
    """A verified protocol request (challenge, validation) answered directly, recording nothing."""

    status: int = 200
    body: Any = None  # JSON-serialisable, or bytes sent as text/plain
    headers: Mapping[str, str] = field(default_factory=dict)


Verdict = Messages | Handshake

Outcome = Literal["accepted", "duplicate", "processed"]


@dataclass(slots=True)
class Recorded:
    """What storing one message did."""

    message_id: str
    outcome: Outcome
    id: int | None  # inbox row id; None for a duplicate


class Rejected(Exception):
    """A delivery refused before anything was recorded; becomes a problem response.

    A subclass sets `status` and `reason`; its problem's `title` is the status's own phrase
    ("Unauthorized" for 401), named once here rather than beside each status."""

    status: ClassVar[int] = 400
    title: ClassVar[str] = HTTPStatus.BAD_REQUEST.phrase
    reason: ClassVar[str] = "bad_request"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "title" not in cls.__dict__:
            cls.title = HTTPStatus(cls.status).phrase

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class Unauthenticated(Rejected):
    status = 401
    reason = "unauthenticated"


class BadDelivery(Rejected):
    """A delivery whose body or headers cannot be read as the kind's: `Rejected`'s 400."""


class UnsupportedMediaType(Rejected):
    status = 415
    reason = "unsupported_media_type"


class Source(ABC, Generic[ConfigT]):
    """One configured source: `verify` authenticates and extracts, `respond` answers the sender.

    A kind's module subclasses this as `Source[ItsConfig]`, sets `kind`, and is listed in
    `service.sources.KINDS`; the ingest path knows nothing else about it. `ItsConfig` is
    also the model the sources file's table is read with (`config_model`).

    What a kind reads of its config on every delivery is best read once, in `__init__`, as
    this class does with the token and the timestamp tolerance: a pydantic model's attributes
    are found through its `__getattr__` hook, the slow way. `generic` read eleven a delivery,
    about 6,000 instructions (docs/benchmarks-log.md).
    """

    kind: ClassVar[str]
    # Set from the class's `Source[...]` (or a generic subclass's) parameter, where that is a
    # model and not a type variable: the config type is named once, where the class is.
    config_model: ClassVar[type[SourceConfig]] = SourceConfig
    # Lower-case header names whose values are credentials under this kind.
    sensitive_headers: ClassVar[frozenset[str]] = frozenset()
    # Longest a sender may redeliver one message; pruning a younger row re-opens duplicates.
    redelivery_days: ClassVar[float] = 3.0

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "config_model" in cls.__dict__:
            return
        for base in cls.__dict__.get("__orig_bases__", ()):
            origin = get_origin(base)
            if isinstance(origin, type) and issubclass(origin, Source):
                for model in get_args(base):
                    if isinstance(model, type) and issubclass(model, SourceConfig):
                        cls.config_model = model

    def __init__(self, name: str, config: ConfigT) -> None:
        self.name = name
        self.config = config
        self._stored_names: dict[bytes, tuple[str, bool]] = {}
        self.tolerance_seconds = config.tolerance_seconds
        self._ordering_key = config.ordering_key

    # A source's secrets are read where it is verified or signed for, once, not when it is
    # built: a command about another source (or none) must not need them (`UnsetSecret`).
    @cached_property
    def _token(self) -> str | None:
        return secret_text(self.config.token)

    async def authenticate(self, delivery: RawDelivery) -> Verdict:
        """Check the shared `token` every kind may require, then the kind's own scheme."""
        if self._token is not None:
            check_token(delivery, self._token)
        verdict = await self.verify(delivery)
        if self._ordering_key is not None and isinstance(verdict, Messages):
            for message in verdict.items:
                message.ordering_key = ordering_key_of(self._ordering_key, message, delivery)
        return verdict

    @abstractmethod
    async def verify(self, delivery: RawDelivery) -> Verdict:
        """Authenticate `delivery` over its raw bytes, then name its messages; raise `Rejected`."""

    def respond(self, results: Sequence[Recorded], batch: bool) -> tuple[int, Any]:
        """The status and JSON body answering a recorded delivery (docs/ingest.md#responses)."""
        if batch:
            return 200, {
                "results": [{"message_id": r.message_id, "status": r.outcome} for r in results]
            }
        (only,) = results
        if only.outcome == "duplicate":
            return 200, {"status": "duplicate", "message_id": only.message_id}
        return 200, {"status": only.outcome, "id": only.id, "message_id": only.message_id}

    async def options(self, delivery: RawDelivery) -> Handshake | None:
        """Answer `OPTIONS /webhooks/{source}` (a protocol handshake), or None for 405."""
        return None

    def answer_rejection(self, rejected: Rejected) -> Handshake | None:
        """A sender-specific answer to a refused delivery, or None for the problem document of
        docs/ingest.md#responses."""
        return None

    def stored_headers(self, raw: Sequence[tuple[bytes, bytes]]) -> dict[str, str]:
        """The request headers worth keeping, with every credential and signature value
        redacted: each name decoded as latin-1 and the last value of a repeated name kept, as
        a dict of `Headers.items()` would hold them.

        Ingest asks it of every header of every delivery, so each name's stored form and
        whether it is redacted (`is_sensitive_header`) are remembered by its raw bytes, looked
        up here without a call a header. Names are the senders' choice: at most
        `MAX_REMEMBERED_HEADERS` are kept."""
        known_names = self._stored_names
        kept: dict[str, str] = {}
        for raw_name, raw_value in raw:
            known = known_names.get(raw_name)
            if known is None:
                known = self._stored_name(raw_name)
            name, sensitive = known
            kept[name] = REDACTED if sensitive else raw_value.decode("latin-1")
        return kept

    def _stored_name(self, raw_name: bytes) -> tuple[str, bool]:
        """A name not remembered yet: its stored form and whether it is redacted."""
        name = raw_name.decode("latin-1")
        known = (name, self.is_sensitive_header(name))
        if len(self._stored_names) < MAX_REMEMBERED_HEADERS:
            self._stored_names[raw_name] = known
        return known

    def start_warning(self) -> str | None:
        """What an operator should hear when this source starts (logged, and in `/readyz`):
        a configuration that starts but is likely not what was meant."""
        return None

    def is_sensitive_header(self, name: str) -> bool:
        lower = name.lower()
        return (
            lower in ALWAYS_SENSITIVE_HEADERS
            or lower in self.sensitive_headers
            or "signature" in lower
            or "token" in lower
            or "secret" in lower
        )

    def example_curl(self, base_url: str) -> str | None:
        """A ready-to-paste signed delivery for the start-up banner, where the kind can make one."""
        return None

    def curl_json(self, base_url: str, headers: Mapping[str, str], body: str) -> str:
        """The `example_curl` that posts the JSON `body` to this source with `headers`."""
        sent = "".join(f"-H '{name}: {value}' " for name, value in headers.items())
        return (
            f"curl -sS -X POST {base_url}/webhooks/{self.name} "
            f"-H 'content-type: application/json' {sent}--data '{body}'"
        )


def constant_time_equal(a: str | bytes, b: str | bytes) -> bool:
    """Compare credentials without leaking where they differ."""
    a_bytes = a.encode() if isinstance(a, str) else a
    b_bytes = b.encode() if isinstance(b, str) else b
    return hmac.compare_digest(a_bytes, b_bytes)


def authorization(delivery: RawDelivery) -> tuple[str, str]:
    """The `Authorization` header's scheme and credentials, split at its first space ("" for
    what is missing); the scheme as sent, to be compared in any case."""
    value = first_header(delivery.raw_headers, b"authorization") or ""
    scheme, _, credentials = value.partition(" ")
    return scheme, credentials


def check_token(delivery: RawDelivery, expected: str) -> None:
    """Accept the shared token from the `token` query parameter or an `Authorization: Bearer`."""
    offered: list[str] = []
    if "token" in delivery.query:
        offered.append(delivery.query["token"])
    scheme, credentials = authorization(delivery)
    if scheme.lower() == "bearer" and credentials:
        offered.append(credentials.strip())
    if not offered:
        raise Unauthenticated("missing token: expected the 'token' query parameter or a Bearer")
    # Evaluate every offer so the time taken does not say which one was compared.
    matches = [constant_time_equal(o, expected) for o in offered]
    if not any(matches):
        raise Unauthenticated("token does not match")


def _reject_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    parsed = dict(pairs)
    if len(parsed) != len(pairs):
        raise ValueError("duplicate key in JSON object")
    return parsed


# One decoder for every body: json.loads with a hook builds a new JSONDecoder on every call.
_STRICT_JSON = json.JSONDecoder(object_pairs_hook=_reject_duplicate_keys)


def parse_json(body: bytes) -> Any:
    """Parse an already-authenticated body strictly: UTF-8, no duplicate keys, bounded nesting."""
    # jiter refuses duplicate keys in Rust, at half the stdlib parse's cost. What it accepts the
    # stdlib parse below accepts alike, with equal values (tests/unit/sources/test_parse_json.py
    # compares them); it refuses more (an escaped lone surrogate, nesting past 200), and for
    # those the stdlib parse has the last word, so a body is never refused that it takes.
    try:
        return jiter.from_json(body, catch_duplicate_keys=True, cache_mode="keys")
    except ValueError:
        pass
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadDelivery("body is not valid UTF-8") from exc
    if text.startswith("\ufeff"):  # what json.loads refuses before decoding
        raise BadDelivery("body is not valid JSON: it starts with a byte order mark")
    try:
        return _STRICT_JSON.decode(text)
    except RecursionError as exc:
        raise BadDelivery("body JSON is nested too deeply") from exc
    except ValueError as exc:
        raise BadDelivery(f"body is not valid JSON: {exc}") from exc


def require_json_media_type(delivery: RawDelivery) -> None:
    """415 unless the request's media type is JSON (`application/json` or `+json`), or absent."""
    if delivery.content_type == "application/json":  # most deliveries: nothing to split
        return
    media = delivery.media_type
    if media and not is_json_media_type(media):
        raise UnsupportedMediaType(f"content type {media!r} is not JSON; this source reads JSON")


# A configured source of any kind, where which one does not matter.
AnySource = Source[Any]


MAX_ORDERING_KEY = 512


def ordering_key_of(spec: str, message: Message, delivery: RawDelivery) -> str | None:
    """The message's ordering key under `spec` (`header:name` or a JSON pointer into its own
    body): a string, or a number written out; None (unordered) where there is none, or the
    value is not a string or number. A key longer than 512 characters is kept as its SHA-256."""
    if spec.startswith(HEADER_PREFIX):
        value: Any = first_header(delivery.raw_headers, spec[len(HEADER_PREFIX) :].encode())
    else:
        try:
            document = parse_json(delivery.body if message.body is None else message.body)
        except BadDelivery:
            return None
        value = resolve_pointer(document, spec)
    if isinstance(value, bool) or not isinstance(value, str | int | float) or value == "":
        return None
    key = str(value)
    if len(key) > MAX_ORDERING_KEY:
        key = "sha256:" + hashlib.sha256(key.encode("utf-8", "backslashreplace")).hexdigest()
    return key
