"""Each source's handlers, resolved from `module:function` strings once at start-up."""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any

from service.core.settings import ConfigError
from service.processing.handler_api import Handler
from service.sources.base import BadDelivery, parse_json
from service.sources.config import ForwardConfig, SourceConfig
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

    # Asked by ingest of every delivery, so worked out once rather than read from the config
    # (a pydantic model: a slow look-up, see `Source`).
    # - has_work: False for a source with neither handlers nor a forward: its messages are
    #   stored `processed` by ingest, with nothing for a worker to do.
    # - sync: its handlers run inside the request's own transaction (`mode = "sync"`).
    # - reads_payload: some route has a payload filter, so the body is parsed to choose.
    has_work: bool = field(init=False)
    sync: bool = field(init=False)
    reads_payload: bool = field(init=False)

    def __post_init__(self) -> None:
        # A frozen dataclass sets its own fields through object.__setattr__.
        object.__setattr__(self, "has_work", bool(self.routes) or self.forward is not None)
        object.__setattr__(self, "sync", self.config.mode == "sync")
        reads = any(route.payload is not None for route in self.routes)
        object.__setattr__(self, "reads_payload", reads)

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


def build_pipeline(name: str, config: SourceConfig) -> Pipeline:
    where = f"sources.{name}"
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


def resolve_pipelines(inbox: InboxConfig) -> dict[str, Pipeline]:
    """Import every configured handler; the first bad one raises a one-line ConfigError."""
    # Like uvicorn's --app-dir default: the user's own package in the working directory.
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    return {name: build_pipeline(name, src.config) for name, src in inbox.sources.items()}
