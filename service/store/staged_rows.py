"""Rows handlers stage with `ctx.insert`, written as one binary COPY per table and column set.

A row built by the ORM and flushed by the unit of work cost the worker 28-160 us of CPU per
message beyond a handler with no effect, by machine (docs/benchmarks-log.md); a tuple appended
here and sent in the batch's COPY, 2-26 us.
The rows are plain values: no model is built or validated, no identity map keeps them, and
nothing is read back (no generated id). Columns left out get their SQLAlchemy `default=` when
it is a value or a function, else the database's own default.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import asyncpg
from sqlalchemy import Column, Table
from sqlalchemy.engine import Dialect

# A column's value as the driver takes it, from the value a handler gave.
Processor = Callable[[Any], Any]


def table_of(target: Any) -> Table:
    """The table behind `target`: a `Table`, or a mapped class (SQLModel `table=True` too)."""
    if isinstance(target, Table):
        return target
    table = getattr(target, "__table__", None)
    if isinstance(table, Table):
        return table
    raise TypeError(
        f"ctx.insert takes a SQLAlchemy Table or a mapped class (a SQLModel table=True model, "
        f"a DeclarativeBase subclass), not {target!r}"
    )


@dataclass(frozen=True)
class _Plan:
    """How rows giving some keys of `table.c` (in that order) are written to `table`."""

    table: Table
    columns: tuple[str, ...]  # the names of the keys given, then of the columns filled by default
    defaults: tuple[Callable[[], Any], ...]
    # One per column (None: the value as it is), or None when no column converts its value.
    processors: tuple[Processor | None, ...] | None


def _default_of(table: Table, column: Column[Any]) -> Callable[[], Any] | None:
    """A left-out column's Python-side default as a function of nothing, or None to leave the
    column to the database (no default here, or a server default)."""
    default = column.default
    if default is None:
        return None
    if default.is_scalar:
        value = default.arg  # type: ignore[attr-defined]
        return lambda: value
    if default.is_callable:
        # SQLAlchemy wraps a function of no arguments into one of an execution context.
        function = default.arg  # type: ignore[attr-defined]
        return lambda: function(None)
    raise ValueError(
        f"column {table.name}.{column.name} has a SQL default that ctx.insert cannot apply; "
        "give it a value"
    )


def _plan(table: Table, given: tuple[str, ...], dialect: Dialect) -> _Plan:
    unknown = [name for name in given if name not in table.c]
    if unknown:
        raise ValueError(f"table {table.name!r} has no column {', '.join(map(repr, unknown))}")
    defaulted: list[str] = []
    defaults: list[Callable[[], Any]] = []
    for column in table.c:
        if column.key in given:
            continue
        default = _default_of(table, column)
        if default is not None:
            defaulted.append(column.key)
            defaults.append(default)
    keys = (*given, *defaulted)
    columns = tuple(table.c[key].name for key in keys)
    processors = tuple(
        table.c[key].type.dialect_impl(dialect).bind_processor(dialect) for key in keys
    )
    return _Plan(table, columns, tuple(defaults), processors if any(processors) else None)


class StagedRows:
    """The rows a batch's handlers staged, grouped by table and column set, in staging order.

    `add` checks the column names when a table is first staged with them (a typo fails the
    handler, not the batch's write) and converts each value as SQLAlchemy would bind it (a
    dict for a JSON column, an enum member); the database checks the rest when they are
    written.
    """

    def __init__(self, dialect: Dialect) -> None:
        self._dialect = dialect
        self._plans: dict[tuple[Table, tuple[str, ...]], _Plan] = {}
        self._rows: dict[_Plan, list[tuple[Any, ...]]] = {}
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def add(self, target: Any, values: Mapping[str, Any]) -> None:
        table = table_of(target)
        given = tuple(values)
        plan = self._plans.get((table, given))
        if plan is None:
            plan = self._plans[(table, given)] = _plan(table, given, self._dialect)
        row = (*values.values(), *(default() for default in plan.defaults))
        if plan.processors is not None:
            row = tuple(
                value if process is None else process(value)
                for value, process in zip(row, plan.processors, strict=True)
            )
        self._rows.setdefault(plan, []).append(row)
        self._count += 1

    def clear(self) -> None:
        self._rows.clear()
        self._count = 0

    async def write(self, driver: asyncpg.Connection) -> None:
        """COPY the staged rows in the transaction open on `driver`, then forget them. On
        failure the transaction is aborted: the caller rolls back (to a savepoint, or whole)."""
        try:
            for plan, rows in self._rows.items():
                await driver.copy_records_to_table(
                    plan.table.name,
                    schema_name=plan.table.schema,
                    columns=plan.columns,
                    records=rows,
                )
        finally:
            self.clear()
