"""Each source's handlers, resolved from `module:function` strings once at start-up."""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from dataclasses import dataclass, field, replace
from fnmatch import fnmatchcase
from typing import Any

from service.core import flow
from service.core.settings import ConfigError
from service.processing.handler_api import Handler
from service.sources.base import BadDelivery, parse_json
from service.sources.config import (
    DestinationConfig,
    EndpointConfig,
    ForwardConfig,
    RateLimit,
    SourceConfig,
    endpoint_source,
)
from service.sources.config_file import InboxConfig
from service.sources.filters import MISSING, PayloadFilter


@dataclass(frozen=True)
class Route:
    """One handler, the event-type globs it is run for, and the payload filter, if any."""

    target: str
    handler: Handler
    event_types: tuple[str, ...] = ("*",)
    payload: PayloadFilter | None = None

    def matches(self, event_type: str | None) -> bool:
        name = event_type or ""
        return any(fnmatchcase(name, pattern) for pattern in self.event_types)


def gates_of(rate_limit: RateLimit | None, forward: ForwardConfig | None) -> flow.Gates:
    """The gates configured for a source's own handlers or forward, or for a destination:
    its rate limit, and a forward's circuit breaker (`core.flow`)."""
    return flow.Gates(
        per_second=None if rate_limit is None else rate_limit.per_second,
        burst=0.0 if rate_limit is None else rate_limit.burst,
        breaker_failures=None if forward is None else forward.breaker_failures,
        cooldown_seconds=30.0 if forward is None else forward.breaker_cooldown_seconds,
    )


@dataclass(frozen=True)
class Destination:
    """One named destination of a source (`[sources.X.destinations.NAME]`): its filter, and
    either its Python handlers (`routes`, each with a filter of its own) or its forward."""

    name: str
    event_types: tuple[str, ...] = ("*",)
    payload: PayloadFilter | None = None
    routes: tuple[Route, ...] = ()
    forward: ForwardConfig | None = None
    rate_limit: RateLimit | None = None

    def matches(self, event_type: str | None) -> bool:
        name = event_type or ""
        return any(fnmatchcase(name, pattern) for pattern in self.event_types)

    @property
    def reads_payload(self) -> bool:
        return self.payload is not None or any(r.payload is not None for r in self.routes)

    @property
    def gated(self) -> bool:
        """Whether its runs are admitted first: by its rate limit, or (a forward) by its
        circuit breaker (`service.processing.gates`)."""
        return self.rate_limit is not None or self.forward is not None

    @property
    def gates(self) -> flow.Gates:
        return gates_of(self.rate_limit, self.forward)


@dataclass(frozen=True)
class Run:
    """A destination a message goes to, and the handlers of it that its message matches (none
    for a forward)."""

    destination: Destination
    handlers: tuple[Handler, ...] = ()


def parsed_payload(body: bytes) -> Any:
    """The body as JSON for the payload filters, or MISSING when it is not JSON."""
    try:
        return parse_json(body)
    except BadDelivery:
        return MISSING


@dataclass(frozen=True)
class Pipeline:
    """What happens to one source's messages: Python handlers, or a forward destination."""

    source: str
    config: SourceConfig
    routes: tuple[Route, ...] = ()
    # Named destinations (`[sources.X.destinations]`), instead of `routes` and `forward`.
    destinations: tuple[Destination, ...] = ()
    # The outbox's endpoints its handlers may send to (`ctx.outbox`).
    endpoints: frozenset[str] = frozenset()
    _by_event_type: dict[str | None, tuple[Handler, ...]] = field(
        default_factory=dict, compare=False, repr=False
    )
    # The routes each event type matches, for `handlers_for_message` (payload filters only).
    _routes_by_event_type: dict[str | None, tuple[Route, ...]] = field(
        default_factory=dict, compare=False, repr=False
    )

    @property
    def forward(self) -> ForwardConfig | None:
        return self.config.forward

    @property
    def gates(self) -> flow.Gates:
        """The gates of the source's own handlers or forward (its default destination)."""
        return gates_of(self.config.rate_limit, self.config.forward)

    # Asked by ingest of every delivery, so worked out once rather than read from the config
    # (a pydantic model: a slow look-up, see `Source`).
    # - has_work: False for a source with neither handlers nor a forward: its messages are
    #   stored `processed` by ingest, with nothing for a worker to do.
    # - sync: its handlers run inside the request's own transaction (`mode = "sync"`).
    # - reads_payload: some route has a payload filter, so the body is parsed to choose.
    # - search_payload: its messages are stored searchable by payload (`searchable`, 0025).
    has_work: bool = field(init=False)
    sync: bool = field(init=False)
    reads_payload: bool = field(init=False)
    search_payload: bool = field(init=False)

    def __post_init__(self) -> None:
        # A frozen dataclass sets its own fields through object.__setattr__.
        work = bool(self.routes or self.destinations) or self.forward is not None
        object.__setattr__(self, "has_work", work)
        object.__setattr__(self, "sync", self.config.mode == "sync")
        reads = any(route.payload is not None for route in self.routes) or any(
            d.reads_payload for d in self.destinations
        )
        object.__setattr__(self, "reads_payload", reads)
        object.__setattr__(self, "search_payload", self.config.search_payload)

    @property
    def fans_out(self) -> bool:
        """Whether the source names its destinations, each with a state of its own."""
        return bool(self.destinations)

    @property
    def forwards_in_batch(self) -> bool:
        """Whether a named destination forwards: its batches run isolated, so that no rollback
        of a batch makes a forward that was answered be sent again."""
        return any(d.forward is not None for d in self.destinations)

    @property
    def gated(self) -> bool:
        """Whether a destination of it is admitted first (`Destination.gated`)."""
        return any(d.gated for d in self.destinations)

    def destination(self, name: str) -> Destination:
        return next(d for d in self.destinations if d.name == name)

    def handlers_for(self, event_type: str | None) -> tuple[Handler, ...]:
        """The handlers to run for `event_type`, in configuration order (memoised)."""
        found = self._by_event_type.get(event_type)
        if found is None:
            found = tuple(r.handler for r in self.routes if r.matches(event_type))
            if len(self._by_event_type) < 10_000:  # event types come from senders: bound it
                self._by_event_type[event_type] = found
        return found

    def handlers_for_message(self, event_type: str | None, body: bytes) -> tuple[Handler, ...]:
        """The handlers to run for a message: by its event type and, where a route has a
        payload filter, by its body (parsed once, and only when a route matches the type)."""
        if not self.reads_payload:
            return self.handlers_for(event_type)
        routes = self._routes_by_event_type.get(event_type)
        if routes is None:
            routes = tuple(route for route in self.routes if route.matches(event_type))
            if len(self._routes_by_event_type) < 10_000:  # as `handlers_for`'s memo
                self._routes_by_event_type[event_type] = routes
        if not routes:
            return ()
        document = parsed_payload(body)
        return tuple(
            route.handler
            for route in routes
            if route.payload is None or route.payload.matches(document)
        )

    def runs_for_message(self, event_type: str | None, body: bytes) -> tuple[Run, ...]:
        """The named destinations a message goes to, in configuration order: those whose
        filter it passes and, for Python handlers, which of theirs it matches (a handler
        destination none of whose handlers match is not one it goes to). The body is parsed
        once, and only when a filter that the event type passes reads it."""
        document: Any = None
        parsed = False
        runs: list[Run] = []
        for destination in self.destinations:
            if not destination.matches(event_type):
                continue
            if destination.reads_payload and not parsed:
                document, parsed = parsed_payload(body), True
            if destination.payload is not None and not destination.payload.matches(document):
                continue
            if destination.forward is not None:
                runs.append(Run(destination))
                continue
            handlers = tuple(
                route.handler
                for route in destination.routes
                if route.matches(event_type)
                and (route.payload is None or route.payload.matches(document))
            )
            if handlers:
                runs.append(Run(destination, handlers))
        return tuple(runs)


def import_handler(target: str) -> Handler:
    """The async function named by `module:function`, or ValueError saying what is wrong."""
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # ImportError, or whatever the module raised while importing
        raise ValueError(
            f"cannot import module {module_name!r}: {type(exc).__name__}: {exc}"
        ) from None
    func = getattr(module, attr, None)
    if func is None:
        raise ValueError(f"module {module_name!r} has no attribute {attr!r}")
    if not inspect.iscoroutinefunction(func):
        raise ValueError(f"{target} must be an `async def handler(message, ctx)` function")
    handler: Handler = func
    return handler


def build_routes(where: str, config: SourceConfig | DestinationConfig) -> list[Route]:
    """The handlers of a source (or of one of its destinations), imported."""
    routes: list[Route] = []
    for i, target in enumerate(config.handlers):
        try:
            routes.append(Route(target, import_handler(target)))
        except ValueError as exc:
            raise ConfigError(f"{where}.handlers[{i}]: {exc}") from None
    for i, spec in enumerate(config.handler):
        try:
            handler = import_handler(spec.target)
        except ValueError as exc:
            raise ConfigError(f"{where}.handler[{i}].target: {exc}") from None
        routes.append(Route(spec.target, handler, tuple(spec.event_types), spec.payload))
    return routes


def build_destination(where: str, name: str, config: DestinationConfig) -> Destination:
    where = f"{where}.destinations.{name}"
    routes = build_routes(where, config)
    if routes and config.forward is not None:
        raise ConfigError(
            f"{where}: a destination either forwards or runs Python handlers, not both "
            "(name two destinations)"
        )
    if not routes and config.forward is None:
        raise ConfigError(
            f"{where}: a destination needs Python handlers (handlers, [[handler]]) or a forward"
        )
    return Destination(
        name,
        tuple(config.event_types),
        config.payload,
        tuple(routes),
        config.forward,
        config.rate_limit,
    )


def build_pipeline(name: str, config: SourceConfig) -> Pipeline:
    where = f"sources.{name}"
    routes = build_routes(where, config)
    if config.ordering_key is not None and config.mode == "sync":
        raise ConfigError(
            f"{where}.ordering_key: sync mode runs each message in its own request; ordering "
            'needs the worker (mode = "async")'
        )
    if config.destinations:
        if routes or config.forward is not None:
            raise ConfigError(
                f"{where}.destinations: a source names its destinations or has handlers and "
                "a forward of its own, not both (move them into a destination)"
            )
        if config.mode == "sync":
            raise ConfigError(
                f"{where}.mode: sync mode runs one source's handlers in the request; "
                "named destinations are async only"
            )
        destinations = tuple(
            build_destination(where, key, value) for key, value in config.destinations.items()
        )
        return Pipeline(name, config, destinations=destinations)
    if config.forward is not None:
        if routes:
            raise ConfigError(
                f"{where}.forward: a source either forwards or runs Python handlers, not both"
            )
        if config.mode == "sync":
            raise ConfigError(
                f"{where}.mode: sync mode runs Python handlers in the request; "
                "a forward destination is async only"
            )
    return Pipeline(name, config, tuple(routes))


def endpoint_pipeline(name: str, endpoint: EndpointConfig) -> Pipeline:
    """What happens to an endpoint's outgoing messages: its source (`outbox:NAME`) forwards
    them to it, with its retry policy, rate limit and breaker (docs/outbox.md)."""
    return Pipeline(endpoint_source(name), endpoint.source_config())


def resolve_pipelines(inbox: InboxConfig) -> dict[str, Pipeline]:
    """Import every configured handler; the first bad one raises a one-line ConfigError. The
    outbox's endpoints are pipelines too, of the sources their outgoing messages are under."""
    # Like uvicorn's --app-dir default: the user's own package in the working directory.
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    endpoints = frozenset(inbox.endpoints)
    pipelines = {
        name: replace(build_pipeline(name, src.config), endpoints=endpoints)
        for name, src in inbox.sources.items()
    }
    for name, endpoint in inbox.endpoints.items():
        pipelines[endpoint_source(name)] = endpoint_pipeline(name, endpoint)
    return pipelines
