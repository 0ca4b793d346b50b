"""Windowed outputs: a user's transform applied to one window's records at a pinned raw version.

For each requested window, `materialize_windows` finds its current pane (see `onceflow.jobs.windows.panes`: early until the window
closes, then on-time, then late panes under `refire`), reads `raw VERSION AS OF` the pane's version, hands the
window's valid records to `output.transform`, and MERGEs the rows into `windows/<asset>` keyed on
`(window_start, *keys)`, replacing exactly that window's rows. Two rows for one key is an error naming the key. A
pane never overwrites a newer one, so a stale retry changes nothing (see `onceflow.jobs.windows.merge`).

The window table's columns are `window_start`, `window_end`, the transform's columns, then `raw_version`, `pane`
and `timing`.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from onceflow.jobs.declare.declaration import Pipeline, WindowedOutput
from onceflow.jobs.declare.record_output import RecordOutput
from onceflow.jobs.delta.raw_table import ensure_raw_table
from onceflow.jobs.delta.schema_evolution import evolve_window_table, pinned_columns
from onceflow.jobs.delta.transactions import create_table_once, latest_version, table_properties
from onceflow.jobs.windows.merge import OutputError, merge_panes_once
from onceflow.jobs.windows.panes import (
    EARLY,
    LATE,
    ON_TIME,
    CloseStore,
    PaneClose,
    Window,
    first_window_start_ms,
)
from onceflow.jobs.windows.pinned_input import PinnedInputExpired, check_pinned_input
from onceflow.jobs.windows.raw_counts import range_filter, rows_before, rows_per_window
from onceflow.resources.faults import fault_point

WINDOWS_PER_PLAN = 32
"""Windows computed in one Spark plan: each is its own transform over a shared cached read."""


log = logging.getLogger("onceflow")


class WindowsExpired(PinnedInputExpired):
    """Some requested windows' pinned input expired (each named in the message); `results` are what the other
    windows of the request materialized, merged and committed."""

    def __init__(self, results: list[WindowResult], expired: list[PinnedInputExpired]) -> None:
        super().__init__(" ".join(str(e) for e in expired))
        self.results = results
        self.expired = expired


@dataclass
class WindowResult:
    """What materializing one window did: its pane, the records it was computed from, rows out, late rows."""

    window: Window
    pane: int
    timing: str
    raw_version: int
    closed: bool
    records: int
    rows: int
    late: int
    latest_raw_version: int
    watermark_ms: int | None
    lost_races: int = 0
    records_before: int | None = None
    """For the pipeline's first window only: raw rows (at `latest_raw_version`) older than it, which no window holds."""


def input_schema(pipeline: Pipeline) -> T.StructType:
    """What a transform receives: `record_id`, `event_time` and the schema's fields."""
    return T.StructType(
        [
            T.StructField("record_id", T.StringType(), False),
            T.StructField("event_time", T.TimestampType(), False),
            *pipeline.record_schema,
        ]
    )


def transform_output(spark: SparkSession, pipeline: Pipeline, output: WindowedOutput | RecordOutput) -> T.StructType:
    """The schema `output.transform` returns, analysed on an empty input (no data is read)."""
    if output.transform is None:
        raise TypeError(f"{output.asset} has no transform")
    empty = spark.createDataFrame([], input_schema(pipeline))
    result = output.transform(empty)
    if not isinstance(result, DataFrame):
        raise TypeError(f"the transform returned {type(result).__name__}, not a DataFrame")
    return result.schema


def materialize_windows(
    spark: SparkSession,
    pipeline: Pipeline,
    output: WindowedOutput,
    windows: list[Window],
    watermark_ms: int | None,
    closes: CloseStore,
    raw_path: str,
    windows_path: str,
) -> list[WindowResult]:
    """Compute each window's current pane and MERGE them into the window table (see the module docstring).

    A window whose pinned input expired is left out; once the others are merged, `WindowsExpired` names it and
    carries the others' results."""
    if not windows:
        return []
    ensure_raw_table(raw_path, pipeline)  # a window materialized before any data is empty
    latest = latest_version(raw_path)
    lateness_ms = output.allowed_lateness_s * 1000
    existing = {w: closes.latest(w) for w in windows}
    refire = {}
    if output.late_policy == "refire":
        refire = rows_per_window(spark, raw_path, latest, {w: c.max_batch_id for w, c in existing.items() if c})
    panes: dict[Window, PaneClose | None] = {}
    for window in windows:
        close = existing[window]
        if close is None and watermark_ms is not None and watermark_ms >= window.end_ms + lateness_ms:
            close = closes.close(window, _new_close(spark, raw_path, window, 1, ON_TIME, latest, watermark_ms))
            fault_point("window.after_close")
        elif close is not None and refire.get(window, 0) > 0:
            close = closes.close(window, _new_close(spark, raw_path, window, close.pane + 1, LATE, latest, watermark_ms))
            fault_point("window.after_close")
        panes[window] = close

    now_ms = int(time.time() * 1000)
    expired: list[PinnedInputExpired] = []
    for window, close in list(panes.items()):
        if close is not None:
            try:
                check_pinned_input(output.asset, window, close, pipeline.retention_s, now_ms)
            except PinnedInputExpired as error:
                expired.append(error)  # that window fails alone: the others of the run are still computed
                del panes[window]
    if not panes:
        raise WindowsExpired([], expired)
    fault_point("window.before_merge")
    counts: dict[Window, tuple[int, int, int]] = {}
    items = list(panes.items())
    for start in range(0, len(items), WINDOWS_PER_PLAN):
        counts |= _merge_panes(spark, pipeline, output, raw_path, windows_path, latest, dict(items[start:start + WINDOWS_PER_PLAN]))
    fault_point("window.after_merge")
    late = rows_per_window(spark, raw_path, latest, {w: c.max_batch_id for w, c in panes.items() if c})
    results = []
    for window, close in panes.items():
        records, rows, races = counts[window]
        version, pane, timing = (latest, 0, EARLY) if close is None else (close.raw_version, close.pane, close.timing)
        results.append(WindowResult(window, pane, timing, version, close is not None, records, rows,
                                    late.get(window, 0), latest, watermark_ms, races))
    first = next((r for r in results if r.window.start_ms == first_window_start_ms(pipeline.start_date)), None)
    if first is not None:
        first.records_before = rows_before(spark, raw_path, latest, first.window.start_ms)
    if expired:
        raise WindowsExpired(results, expired)
    return results


def _new_close(
    spark: SparkSession, raw_path: str, window: Window, pane: int, timing: str, version: int, watermark_ms: int | None
) -> PaneClose:
    max_batch = spark.sql(f"SELECT max(batch_id) AS b FROM delta.`{raw_path}` VERSION AS OF {version}").collect()[0]["b"]
    return PaneClose(
        window_start_ms=window.start_ms,
        pane=pane,
        timing=timing,
        raw_version=version,
        max_batch_id=int(max_batch or 0),
        watermark_ms=watermark_ms,
        closed_at_ms=int(time.time() * 1000),
    )


def pane_frame(
    spark: SparkSession, pipeline: Pipeline, output: WindowedOutput, raw_path: str, version: int,
    panes: list[tuple[Window, int, str]],
) -> tuple[DataFrame, DataFrame]:
    """(records, rows): the windows' input records at `version` (with `_w`, the window start in ms) and the
    transform's rows for every `(window, pane, timing)`, with onceflow's columns added."""
    size = output.window_s * 1000
    columns = pinned_columns(raw_path, version, input_schema(pipeline))  # a field added later reads NULL
    records = spark.sql(
        f"SELECT {columns}, floor(unix_millis(event_time) / {size}) * {size} AS _w "
        f"FROM delta.`{raw_path}` VERSION AS OF {version} WHERE {range_filter(raw_path, [w for w, _, _ in panes])}"
    )
    parts = []
    for window, pane, timing in panes:
        rows = output.transform(records.filter(F.col("_w") == window.start_ms).drop("_w"))
        parts.append(
            rows.select(
                F.timestamp_millis(F.lit(window.start_ms)).alias("window_start"),
                F.timestamp_millis(F.lit(window.end_ms)).alias("window_end"),
                *rows.columns,
                F.lit(version).cast("bigint").alias("raw_version"),
                F.lit(pane).cast("int").alias("pane"),
                F.lit(timing).alias("timing"),
            )
        )
    result = parts[0]
    for part in parts[1:]:
        result = result.unionByName(part)
    return records, result


def _merge_panes(
    spark: SparkSession,
    pipeline: Pipeline,
    output: WindowedOutput,
    raw_path: str,
    windows_path: str,
    latest: int,
    panes: dict[Window, PaneClose | None],
) -> dict[Window, tuple[int, int, int]]:
    """Replace each window's rows with its pane's; returns (input records, output rows, lost races) per window."""
    by_version: dict[int, list[tuple[Window, int, str]]] = {}
    for window, close in panes.items():
        version = latest if close is None else close.raw_version
        pane, timing = (0, EARLY) if close is None else (close.pane, close.timing)
        by_version.setdefault(version, []).append((window, pane, timing))
    frames = [pane_frame(spark, pipeline, output, raw_path, v, items) for v, items in by_version.items()]
    # Each window's transform reads the same records: read them once.
    cached = [records.cache() for records, _ in frames]
    inputs: dict[int, int] = {}
    for records in cached:
        inputs |= {int(r["_w"]): int(r["n"]) for r in records.groupBy("_w").agg(F.count("*").alias("n")).collect()}
    result = frames[0][1]
    for _, more_rows in frames[1:]:
        result = result.unionByName(more_rows)
    result = result.cache()
    try:
        _check_output(spark, output, windows_path, result, table_properties(pipeline.retention_s))
        rows = {
            int(r["s"]): int(r["n"])
            for r in result.groupBy("window_start").agg(F.expr("unix_millis(window_start) AS s"), F.count("*").alias("n")).collect()
        }
        view = f"onceflow_panes_{uuid.uuid4().hex}"
        result.createOrReplaceTempView(view)
        try:
            conflicts = merge_panes_once(spark, windows_path, view, list(output.keys), output.asset, panes)
        finally:
            spark.catalog.dropTempView(view)
    finally:
        result.unpersist()
        for records in cached:
            records.unpersist()
    return {w: (inputs.get(w.start_ms, 0), rows.get(w.start_ms, 0), conflicts) for w in panes}


def _check_output(
    spark: SparkSession, output: WindowedOutput, windows_path: str, result: DataFrame, properties: dict[str, str]
) -> None:
    """One row per `(window, *keys)`, then the columns the window table has (created from the first result)."""
    keys = ["window_start", *output.keys]
    doubled = result.groupBy(*keys).count().filter("count > 1").limit(3).collect()
    if doubled:
        first = doubled[0]
        named = ", ".join(f"{k}={first[k]!r}" for k in output.keys) or "(no keys: one row per window)"
        raise OutputError(
            f"{output.asset}: the transform returned {first['count']} rows for window {first['window_start']} "
            f"and key {named}; it must return one row per value of keys {list(output.keys)}"
        )
    create_table_once(windows_path, result.schema, properties)
    evolve_window_table(output, windows_path, result.schema)  # new columns are added, any other change refused
