"""What `ctx.insert` stages: column checks, defaults, values converted as SQLAlchemy binds them."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from sqlalchemy import Column, Integer, MetaData, Sequence, Table, Text, func
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.dialects.postgresql.asyncpg import dialect as asyncpg_dialect

from service.store.staged_rows import StagedRows, table_of
from tests.handlers import EFFECTS, Effect, MappedEffect

counter = itertools.count(1)

ROWS = Table(
    "rows",
    MetaData(),
    Column("id", Integer, primary_key=True),
    Column("name", Text),
    Column("kind", Text, default="plain"),
    Column("serial", Integer, default=lambda: next(counter)),
    Column("data", JSONB),
    Column("stamp", Text, server_default="x"),
)


def staged() -> StagedRows:
    return StagedRows(asyncpg_dialect())


def rows_of(rows: StagedRows) -> dict[tuple[str, ...], list[tuple[Any, ...]]]:
    """The staged rows by column list, as they would be written."""
    return {plan.columns: list(batch) for plan, batch in rows._rows.items()}


@pytest.mark.parametrize("target", [EFFECTS, Effect, MappedEffect])
def test_a_table_a_sqlmodel_class_and_a_mapped_class_name_the_same_table(target: Any) -> None:
    assert table_of(target).name == "effects"


def test_anything_else_is_refused_at_once() -> None:
    with pytest.raises(TypeError, match="a SQLAlchemy Table or a mapped class"):
        staged().add("effects", {"source": "s"})


def test_a_column_the_table_lacks_is_refused_before_anything_is_staged() -> None:
    rows = staged()
    with pytest.raises(ValueError, match="table 'rows' has no column 'nmae'"):
        rows.add(ROWS, {"id": 1, "nmae": "a"})
    assert len(rows) == 0


def test_python_defaults_fill_left_out_columns_and_server_defaults_are_left_out() -> None:
    rows = staged()
    rows.add(ROWS, {"id": 1, "name": "a"})
    rows.add(ROWS, {"id": 2, "name": "b"})
    (columns, written), *_ = rows_of(rows).items()
    assert columns == ("id", "name", "kind", "serial")  # no `data` (none), no `stamp` (server)
    first, second = written
    assert first[:3] == (1, "a", "plain")
    assert second[:3] == (2, "b", "plain")
    assert second[3] == first[3] + 1  # the function ran for each row


def test_a_given_value_wins_over_the_default() -> None:
    rows = staged()
    rows.add(ROWS, {"id": 1, "kind": "special", "serial": 7})
    assert rows_of(rows)[("id", "kind", "serial")] == [(1, "special", 7)]


def test_a_json_column_takes_a_python_value_encoded_as_the_session_would() -> None:
    rows = staged()
    rows.add(ROWS, {"id": 1, "kind": "k", "serial": 1, "data": {"a": [1, "é"]}})
    ((_, _, _, data),) = rows_of(rows)[("id", "kind", "serial", "data")]
    assert json.loads(data) == {"a": [1, "é"]}


def test_rows_giving_other_columns_are_written_apart() -> None:
    rows = staged()
    rows.add(ROWS, {"id": 1, "kind": "k", "serial": 1})
    rows.add(ROWS, {"id": 2, "kind": "k", "serial": 2, "name": "n"})
    rows.add(ROWS, {"id": 3, "kind": "k", "serial": 3})
    assert rows_of(rows) == {
        ("id", "kind", "serial"): [(1, "k", 1), (3, "k", 3)],
        ("id", "kind", "serial", "name"): [(2, "k", 2, "n")],
    }
    assert len(rows) == 3
    rows.clear()
    assert len(rows) == 0
    assert rows_of(rows) == {}


def test_a_column_whose_key_is_not_its_name_is_given_by_key_and_written_by_name() -> None:
    table = Table("people", MetaData(), Column("Full Name", Text, key="full_name"))
    rows = staged()
    rows.add(table, {"full_name": "Ada"})
    assert rows_of(rows) == {("Full Name",): [("Ada",)]}


@pytest.mark.parametrize(
    "default", [Sequence("rows_seq"), func.now()], ids=["sequence", "sql-expression"]
)
def test_a_sql_side_default_it_cannot_apply_asks_for_a_value(default: Any) -> None:
    table = Table("t", MetaData(), Column("id", Integer), Column("n", Integer, default=default))
    with pytest.raises(ValueError, match=r"column t\.n has a SQL default .* give it a value"):
        staged().add(table, {"id": 1})
    rows = staged()
    rows.add(table, {"id": 1, "n": 2})
    assert len(rows) == 1
