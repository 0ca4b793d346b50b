"""Dagster's standard table metadata (`dagster/uri`, `dagster/table_name`, `dagster/column_schema`,
`dagster/row_count`) for onceflow's Delta tables, so the catalog, lineage and row-count plots of Dagster's UI show
them as they show any other table. Read from the declaration where it fixes them, else from the table's log."""

from __future__ import annotations

import contextlib
import time
from typing import Any

import dagster as dg
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import types as T

from onceflow.resources.delta_storage import table_snapshot


def column_schema(schema: T.StructType) -> dg.TableSchema:
    """A Spark schema as Dagster's column schema: each column's name, its type in Spark's DDL, NOT NULL."""
    return dg.TableSchema(columns=[
        dg.TableColumn(f.name, f.dataType.simpleString(), constraints=dg.TableColumnConstraints(nullable=f.nullable))
        for f in schema.fields
    ])


def arrow_column_schema(schema: pa.Schema) -> dg.TableSchema:
    """An Arrow schema (a Delta table's, read with delta-rs) as Dagster's column schema."""
    return dg.TableSchema(columns=[
        dg.TableColumn(f.name, str(f.type), constraints=dg.TableColumnConstraints(nullable=f.nullable))
        for f in schema
    ])


def table_definition_metadata(uri: str, table: str, schema: T.StructType | None = None) -> dict[str, Any]:
    """What an asset's definition says of its table: where it is, its name in the lake, its columns."""
    metadata: dict[str, Any] = {"dagster/uri": uri, "dagster/table_name": table}
    if schema is not None:
        metadata["dagster/column_schema"] = column_schema(schema)
    return metadata


def table_metadata(uri: str, table: str) -> dict[str, Any]:
    """A materialization's table metadata: where the table is, its name, and its columns as its log says (a
    window table's are its transform's), left out when the table cannot be read."""
    metadata: dict[str, Any] = {"dagster/uri": uri, "dagster/table_name": table}
    with contextlib.suppress(Exception):  # an observation only, as in `row_count`
        metadata["dagster/column_schema"] = arrow_column_schema(pa.schema(table_snapshot(uri).schema().to_arrow()))
    return metadata


class RowCounts:
    """The raw table's rows for a run's materializations, read from the log (`row_count`) at most once every
    `every_s` seconds: a batch's report waits for the one before it, and a reading of a long log on object
    storage can take longer than a batch. A batch reported between two readings carries none (Dagster's plot of
    `dagster/row_count` joins the points it has)."""

    def __init__(self, uri: str, every_s: float = 10.0) -> None:
        self.uri, self.every_s, self._read_at = uri, every_s, float("-inf")

    def at(self, version: int | None) -> int | None:
        now = time.monotonic()
        if version is None or now - self._read_at < self.every_s:
            return None
        self._read_at = now
        return row_count(self.uri, version)


def row_count(uri: str, version: int) -> int | None:
    """The rows the Delta table at `uri` holds at `version`, from its log's file statistics (no data read); None
    when the log does not say (a file written without statistics) or cannot be read: metadata never fails a run."""
    try:
        actions = pa.table(table_snapshot(uri, version).get_add_actions(flatten=True))
        counts = actions.column("num_records")
        return None if counts.null_count else int(pc.sum(counts).as_py() or 0)
    except Exception:  # an observation only: the batch is committed whatever this finds
        return None
