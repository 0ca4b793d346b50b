"""Changing a pipeline's schema: a table's columns only ever gain nullable top-level columns.

A declaration may add nullable fields to its record schema, and a transform may return new columns: the raw and
window tables gain them as nullable columns appended to the table (delta-rs commits the new schema; no data file
is rewritten, old rows read NULL). Any other difference between a table and what is declared for it -- a type
changed, a field dropped or renamed, NOT NULL added or removed, a new NOT NULL field (old rows would violate it), a
field added inside a STRUCT -- is refused with a `DeclarationError` naming the pipeline (or output), the field,
the table's type and the declared one, and the ways out. The raw table is checked when the code location loads
(`onceflow.orchestration.pipelines.table_check`) and again before a run's first batch (`onceflow.jobs.ingest.batch_ingest.ensure_raw_table`); a
window table before its first MERGE of a run.

Two processes evolving a table at once both end well: the loser's commit fails, it reads the table again and
finds the columns added. Schemas are read from the Delta log with delta-rs (no Spark).

Also here: `conform`, which never lets rows be written as files of a table whose schema they do not have, and
`pinned_columns`, which reads a table version from before a column was added with that column as NULL.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import pyarrow as pa
from deltalake import Field
from deltalake.exceptions import CommitFailedError, TableNotFoundError
from pyspark.sql import DataFrame
from pyspark.sql import types as T
from pyspark.sql.pandas.types import from_arrow_schema

from onceflow.jobs.declare.declaration import DeclarationError, Pipeline, WindowedOutput
from onceflow.jobs.declare.schema import quoted, type_ddl
from onceflow.resources.delta_storage import delta_table

EVOLVE_TRIES = 5
WAYS_OUT = (
    "A table only gains nullable fields (old rows read NULL); for any other change declare the field as the "
    "table holds it, or declare the pipeline under a new name (new tables, filled from its source anew)"
)
log = logging.getLogger("onceflow")
_settled: set[tuple[str, str]] = set()


class TableSchemaError(RuntimeError):
    """Rows about to be written as files of a table whose schema they do not have."""


@dataclass(frozen=True)
class Mismatch:
    """A field whose table column and declaration disagree, each rendered as DDL."""

    field: str
    table: str
    declared: str


def table_schema(path: str, version: int | None = None) -> T.StructType | None:
    """The table's schema (at `version`, default the newest) read from its log; None when there is no table."""
    try:
        table = delta_table(path, version=version)
    except TableNotFoundError:
        return None
    return T.StructType.fromJson(json.loads(table.schema().to_json()))


def ddl(field: T.StructField) -> str:
    """`field`'s type as a declaration writes it (`DECIMAL(18,2) NOT NULL`, `STRUCT<a: INT NOT NULL>`)."""
    return type_ddl(field.dataType, for_reader=False) + ("" if field.nullable else " NOT NULL")


def differences(table: T.StructType, wanted: T.StructType, strict: bool) -> tuple[list[T.StructField], list[Mismatch]]:
    """(columns to add, mismatches) taking `table` to `wanted`, matched by name (order is free at the top level).

    `strict` (a record schema) compares nullability too and refuses a new NOT NULL field; otherwise (a transform's
    output, whose nullability Spark infers) only types count and every new column is added as nullable.
    """
    declared = {f.name: f for f in wanted}
    problems = []
    for held in table:
        field = declared.get(held.name)
        if field is None:
            problems.append(Mismatch(held.name, ddl(held), "nothing (dropped or renamed)"))
        elif (ddl(held) != ddl(field)) if strict else (held.dataType.simpleString() != field.dataType.simpleString()):
            problems.append(Mismatch(held.name, ddl(held), ddl(field)))
    added = []
    for field in wanted:
        if field.name in table.names:
            continue
        if strict and not field.nullable:
            problems.append(Mismatch(field.name, "no such column (old rows have no value)", ddl(field)))
        added.append(T.StructField(field.name, field.dataType, True))
    return added, problems


def evolve_raw_table(pipeline: Pipeline, path: str, wanted: T.StructType) -> None:
    """Add the record schema's new nullable fields to the raw table at `path`; `DeclarationError` for any other
    change. Nothing to do without a table (its first batch creates it)."""

    def refuse(problems: list[Mismatch]) -> DeclarationError:
        found = "; ".join(f"field {p.field!r}: the table {pipeline.raw_table} holds {p.table}, the declaration says "
                          f"{p.declared}" for p in problems)
        return DeclarationError(f"pipeline {pipeline.name!r}: schema: {found}. {WAYS_OUT}")

    _evolve(path, wanted, True, refuse)


def evolve_window_table(output: WindowedOutput, path: str, wanted: T.StructType) -> None:
    """Add the columns a transform's output gained to its window table at `path`; `DeclarationError` for any
    other change."""

    def refuse(problems: list[Mismatch]) -> DeclarationError:
        found = "; ".join(f"column {p.field!r}: the table {output.table} holds {p.table}, the transform returns "
                          f"{p.declared}" for p in problems)
        return DeclarationError(
            f"output {output.asset!r}: {found}. A window table only gains columns (older windows read NULL); for "
            "any other change return the column as the table holds it, or declare the output under a new asset name"
        )

    _evolve(path, wanted, False, refuse)


def _evolve(path: str, wanted: T.StructType, strict: bool, refuse: Callable[[list[Mismatch]], Exception]) -> None:
    key = (path, wanted.json())
    if key in _settled:
        return  # this process checked this table against this very schema
    for _ in range(EVOLVE_TRIES):
        table = table_schema(path)
        if table is None:
            return
        added, problems = differences(table, wanted, strict)
        if problems:
            raise refuse(problems)
        if not added:
            _settled.add(key)
            return
        try:  # then look again: the next pass finds nothing to add
            delta_table(path).alter.add_columns([Field.from_json(json.dumps(f.jsonValue())) for f in added])
            log.info(f"{path}: added the nullable columns {', '.join(f.name for f in added)}")
        except CommitFailedError:
            pass  # another process changed the table first (adding the same columns, likely)
    raise RuntimeError(f"{path}: {EVOLVE_TRIES} attempts to add columns each lost to a concurrent commit")


def conform(df: DataFrame, table: T.StructType, path: str) -> DataFrame:
    """`df` with the table's columns in the table's order; `TableSchemaError` unless `df` has exactly the table's
    columns with the table's types (nullability aside: the writer enforces the table's NOT NULL columns)."""
    _same_columns(df.schema, table, path)
    return df.select(*(quoted(f.name) for f in table))


def conform_arrow(rows: pa.Table, table: T.StructType, path: str) -> pa.Table:
    """`conform` for rows held as Arrow (as Spark's `toArrow` gives them): their Spark types are read back from their
    Arrow types, so the same rows pass or fail as the DataFrame they came from would."""
    _same_columns(from_arrow_schema(rows.schema), table, path)
    return rows.select([f.name for f in table])


def _same_columns(rows: T.StructType, table: T.StructType, path: str) -> None:
    have = {f.name: f.dataType.simpleString() for f in rows}
    held = {f.name: f.dataType.simpleString() for f in table}
    if have != held:
        differing = sorted(name for name in have.keys() | held.keys() if have.get(name) != held.get(name))
        detail = ", ".join(f"{n} ({have.get(n, 'absent')} in the rows, {held.get(n, 'absent')} in the table)"
                           for n in differing)
        raise TableSchemaError(f"{path}: the rows to append do not have the table's schema: {detail}; nothing written")


@lru_cache(maxsize=256)
def _names_at(path: str, version: int) -> frozenset[str]:
    schema = table_schema(path, version)  # a version never changes: read once per process
    return frozenset(schema.names if schema else ())


def pinned_columns(path: str, version: int, fields: T.StructType) -> str:
    """SQL selecting `fields` from the table at `version`, a column added after that version as a typed NULL."""
    present = _names_at(path, version)
    return ", ".join(quoted(f.name) if f.name in present else f"CAST(NULL AS {f.dataType.simpleString()}) AS "
                     f"{quoted(f.name)}" for f in fields)
