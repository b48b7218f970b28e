"""The handler API: what a handler receives, and the exceptions it raises to steer retries."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping, Set
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.ext.asyncio import AsyncSession as SQLAlchemyAsyncSession
from sqlmodel.ext.asyncio.session import AsyncSession

from service.store.outgoing import derived_key, stage_async, stage_values
from service.store.staged_rows import StagedRows


@dataclass(frozen=True)
class InboxMessage:
    """One accepted message, as a handler sees it."""

    id: int
    """The inbox row id (the `id` in ingest answers and the admin API)."""
    source: str
    message_id: str
    """The dedup key the source's kind extracted."""
    event_type: str | None
    attempt: int
    """1 on the first run of the handlers, 2 on the first retry, and so on."""
    headers: Mapping[str, str]
    """The delivery's headers, credentials and signatures redacted."""
    body: bytes
    content_type: str | None = None

    @cached_property
    def payload(self) -> Any:
        """The body parsed as JSON, or `None` when it is not JSON."""
        try:
            return json.loads(self.body)
        except ValueError:  # includes UnicodeDecodeError
            return None


class HandlerCommitError(RuntimeError):
    """A handler called `commit()` or `rollback()` on `ctx.session`: the inbox owns those."""


class HandlerSession(AsyncSession):
    """`ctx.session`: an `AsyncSession` in the inbox's transaction; the inbox commits it.

    The session joins the batch's connection (`join_transaction_mode="rollback_only"`) and each
    message runs inside its own SAVEPOINT, which the inbox issues on the driver connection
    (`MessageSavepoints`); the inbox releases it when every handler has returned, or rolls back
    to it when one raised, and commits the batch with the messages' `processed` marks. A
    handler that commits itself would break that, so it is refused.
    """

    _handler_running: bool = False
    _commit_refused: bool = False

    def __init__(self, bind: AsyncConnection, **kwargs: Any) -> None:
        super().__init__(bind=bind, **kwargs)
        # The rows of `ctx.insert`, written by the inbox when it flushes the session.
        self.staged_rows = StagedRows(bind.dialect)

    async def execute(self, *args: Any, **kwargs: Any) -> Any:
        # SQLModel marks `execute` deprecated in favour of `exec`; docs/handlers.md#the-handler-api
        # offers both, and a handler's `execute(text(...))` should not warn on every message.
        return await SQLAlchemyAsyncSession.execute(self, *args, **kwargs)

    async def commit(self) -> None:
        self._refuse_in_handler(
            "a handler must not commit: webhook-inbox commits your effects together with "
            "the message's processed mark once every handler has returned"
        )
        await super().commit()

    async def rollback(self) -> None:
        self._refuse_in_handler(
            "a handler must not roll back: raise an exception instead, and webhook-inbox "
            "rolls back this message's effects and records the failed attempt"
        )
        await super().rollback()

    def _refuse_in_handler(self, why: str) -> None:
        """While a handler runs, a commit or rollback is the inbox's: refuse it, and remember
        the refusal (`_commit_refused`) in case the handler catches the error."""
        if self._handler_running:
            self._commit_refused = True
            raise HandlerCommitError(why)


class HandlerOutbox:
    """`ctx.outbox`: a handler's outgoing messages, staged in the inbox's transaction, so
    that they are sent if and only if the message's effects commit (a failed attempt's are
    rolled back with its effects)."""

    def __init__(
        self,
        session: Any,
        source: str,
        message_id: str,
        destination: str | None,
        endpoints: Set[str] | None,
    ) -> None:
        self._session = session
        self._source = source
        self._message_id = message_id
        self._destination = destination
        self._endpoints = endpoints
        self._staged = 0

    async def send(
        self,
        endpoint: str,
        payload: Any,
        *,
        event_type: str | None = None,
        key: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> str:
        """Stage an outgoing message to `endpoint` (`[endpoints.NAME]`); its key.

        `key` by default: derived from the incoming message and this send's position among
        its handlers' sends (`derived_key`), the same on every attempt. Raises ValueError for
        an endpoint not configured or a bad argument (the attempt fails, as any handler
        error fails it).
        """
        if self._endpoints is not None and endpoint not in self._endpoints:
            known = ", ".join(sorted(self._endpoints)) or "none"
            raise ValueError(f"no endpoint named {endpoint!r} (configured: {known})")
        self._staged += 1
        if key is None:
            key = derived_key(self._source, self._message_id, self._destination, self._staged)
        values = stage_values(endpoint, payload, event_type=event_type, key=key, headers=headers)
        await stage_async(self._session, values)
        return str(values["message_id"])


@dataclass
class HandlerContext:
    """What a handler may use besides the message: the session of the inbox's transaction,
    and the outbox, whose outgoing messages are sent once that transaction commits
    (`await ctx.outbox.send(endpoint, payload)`, docs/outbox.md)."""

    session: HandlerSession
    outbox: HandlerOutbox

    def insert(self, table: Any, values: Mapping[str, Any]) -> None:
        """Stage one row of `table` (a `Table`, a mapped class or a SQLModel `table=True`
        model), `values` by column name, to be inserted in the inbox's transaction.

        The cheapest effect a handler can stage: no model is built, and the worker writes a
        batch's rows of one table as one COPY, after its handlers have returned. So a query
        of the handlers' own does not see them, nothing is read back (no generated id), and
        a row the database refuses fails its message as a failing flush does. Raises
        `ValueError` at once for a column the table does not have.
        """
        self.session.staged_rows.add(table, values)


Handler = Callable[[InboxMessage, HandlerContext], Awaitable[None]]


class PermanentFailure(Exception):
    """Raise from a handler when retrying cannot help: the message goes to the dead letters now."""


class RetryLater(Exception):
    """Raise from a handler to retry after `after_seconds` instead of the usual backoff.

    It still counts as an attempt: at `max_attempts` the message is dead.
    """

    def __init__(self, after_seconds: float, reason: str = "") -> None:
        if after_seconds < 0:
            raise ValueError("after_seconds must be >= 0")
        super().__init__(reason or f"retry requested in {after_seconds:g}s")
        self.after_seconds = float(after_seconds)
