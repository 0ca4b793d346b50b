"""Data files for a Delta table written by Spark's own Parquet writer, described as Delta add actions for delta-rs
to commit: how an append's files are written over Spark Connect, whose client cannot reach Delta's writer.

Spark writes the rows, partitioned as the table is, into a directory of their own inside the table
(`onceflow-<uuid>/<partition>=<value>/part-*.parquet`): an attempt's files never mix with another's, and those of
an attempt that never commits are unreferenced files that VACUUM removes, as Delta's own writer leaves them. Each
file's size comes from storage, its partition values from its path, its statistics from its Parquet footer: the
row count and, for the table's statistics columns, the minimum, maximum and null count Delta's writer would have
recorded (long strings cut as Delta cuts them, times to the millisecond, each still a bound).
"""

from __future__ import annotations

import json
import time
import uuid
from datetime import UTC, date, datetime, timedelta
from typing import Any
from urllib.parse import unquote

import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake import DeltaTable
from deltalake.transaction import AddAction
from pyspark.sql import DataFrame
from pyspark.sql import types as T

from onceflow.jobs.delta.schema_evolution import conform
from onceflow.resources.delta_storage import table_files

STATS_PREFIX = 32
"""Characters of a string statistic Delta keeps (`delta.dataSkippingStatsColumns` strings are cut there too)."""
_ABOVE_ALL = "\U0010ffff"  # Delta's tie-breaker after a cut maximum: it sorts after every prefix-sharing string
_NULL_PARTITION = "__HIVE_DEFAULT_PARTITION__"
_STATS_COLUMNS = "delta.dataSkippingStatsColumns"
_INDEXED_COLUMNS = 32  # without that property, Delta collects statistics for the first 32 columns
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def write_parquet_files(df: DataFrame, table: DeltaTable) -> list[AddAction]:
    """Write `df` (with exactly `table`'s columns) as data files of `table`, uncommitted: their add actions."""
    path = table.table_uri.rstrip("/")
    schema = T.StructType.fromJson(json.loads(table.schema().to_json()))
    df = conform(df, schema, path)
    partitions = list(table.metadata().partition_columns)
    directory = f"onceflow-{uuid.uuid4().hex}"
    # Statistics come from the footers: a timestamp written as INT96 (Spark's default) has none.
    df.sparkSession.conf.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
    (df.write.partitionBy(*partitions).option("mapreduce.fileoutputcommitter.marksuccessfuljobs", "false")
     .parquet(f"{path}/{directory}"))
    files, root = table_files(path)
    written = files.get_file_info(pafs.FileSelector(f"{root}/{directory}", recursive=True))
    columns = stats_columns(schema, partitions, table.metadata().configuration)
    now_ms = int(time.time() * 1000)
    return [
        AddAction(f.path.removeprefix(f"{root}/"), f.size, partition_values(f.path, partitions),
                  now_ms if f.mtime_ns is None else f.mtime_ns // 1_000_000, True,
                  # Characters past U+FFFF as UTF-8, as Delta's writer leaves them: delta-rs misreads their
                  # escaped form (a surrogate pair), and the cut maximum's U+10FFFF would read as a lower bound.
                  json.dumps(footer_stats(pq.read_metadata(files.open_input_file(f.path)), columns),
                             ensure_ascii=False))
        for f in written if f.type == pafs.FileType.File and f.base_name.endswith(".parquet")
    ]


def partition_values(file_path: str, partitions: list[str]) -> dict[str, str | None]:
    """A file's partition values from its `name=value` directories (Spark escapes values as %XX)."""
    found = {}
    for part in file_path.split("/")[:-1]:
        name, equals, value = part.partition("=")
        if equals and unquote(name) in partitions:
            found[unquote(name)] = None if value == _NULL_PARTITION else unquote(value)
    return {name: found.get(name) for name in partitions}


def stats_columns(schema: T.StructType, partitions: list[str], configuration: dict[str, str]) -> set[str]:
    """The top-level columns Delta keeps statistics for: the table's `dataSkippingStatsColumns`, else its first 32
    data columns (statistics of nested columns are left out: no reader of onceflow's tables skips by them)."""
    named = configuration.get(_STATS_COLUMNS)
    if named:
        return {name.strip().strip("`") for name in named.split(",")}
    data = [f.name for f in schema if f.name not in partitions]
    return set(data[:_INDEXED_COLUMNS])


def footer_stats(footer: pq.FileMetaData, columns: set[str]) -> dict[str, Any]:
    """Delta's statistics of a file from its Parquet footer: `numRecords`, and per column of `columns` that is a
    top-level primitive, `nullCount`, then `minValues` and `maxValues` when every row group has them."""
    stats: dict[str, Any] = {"numRecords": footer.num_rows, "minValues": {}, "maxValues": {}, "nullCount": {}}
    for i in range(footer.num_columns):
        name = footer.schema.column(i).path
        if name not in columns:
            continue
        groups = [footer.row_group(g).column(i).statistics for g in range(footer.num_row_groups)]
        if any(s is None or not s.has_null_count for s in groups):
            continue
        stats["nullCount"][name] = sum(s.null_count for s in groups)
        valued = [s for s in groups if s.has_min_max]
        # A row group without a minimum and maximum must hold only nulls; else its values are unknown.
        if not valued or any(not s.has_min_max and s.num_values for s in groups):
            continue
        low, high = min(s.min for s in valued), max(s.max for s in valued)
        bounds = _bounds(low, high)
        if bounds is not None:
            stats["minValues"][name], stats["maxValues"][name] = bounds
    return stats


def _bounds(low: Any, high: Any) -> tuple[Any, Any] | None:
    """A column's minimum and maximum as Delta writes them in a statistics JSON, each still a bound; None for a
    type onceflow's tables keep no statistics of (decimals, floats, bytes: their JSON forms would round)."""
    if isinstance(low, str):
        return low[:STATS_PREFIX], high if len(high) <= STATS_PREFIX else high[:STATS_PREFIX] + _ABOVE_ALL
    if isinstance(low, datetime):
        micros_low, micros_high = _micros(low), _micros(high)
        return _millis(micros_low // 1000), _millis(-(-micros_high // 1000))
    if isinstance(low, date):
        return low.isoformat(), high.isoformat()
    if isinstance(low, int) and not isinstance(low, bool):
        return low, high
    return None


def _micros(value: datetime) -> int:
    value = value if value.tzinfo else value.replace(tzinfo=UTC)
    return (value - _EPOCH) // timedelta(microseconds=1)


def _millis(millis: int) -> str:
    """Epoch milliseconds as Delta writes a time statistic."""
    return (_EPOCH + timedelta(milliseconds=millis)).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
