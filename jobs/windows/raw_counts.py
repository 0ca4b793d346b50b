"""Counting the raw table's rows per event-time window at a Delta version: one scan for many windows, pruned to
the time buckets the windows cover."""

from __future__ import annotations

from pyspark.sql import SparkSession

from onceflow.jobs.delta.raw_table import bucket_ms
from onceflow.jobs.windows.panes import Window


def range_filter(raw_path: str, windows: list[Window]) -> str:
    """Event-time bounds covering all windows, with the time-bucket predicate that prunes raw's partitions."""
    lo, hi = min(w.start_ms for w in windows), max(w.end_ms for w in windows)
    return f"event_time >= timestamp_millis({lo}) AND event_time < timestamp_millis({hi}) AND {bucket_filter(raw_path, windows)}"


def bucket_filter(raw_path: str, windows: list[Window]) -> str:
    """The predicate on raw's partition column that keeps the whole time buckets the windows overlap."""
    lo, hi, width = min(w.start_ms for w in windows), max(w.end_ms for w in windows), bucket_ms(raw_path)
    return f"time_bucket BETWEEN {lo // width} AND {(hi - 1) // width}"


def rows_per_window(
    spark: SparkSession, raw_path: str, version: int, after_batch: dict[Window, int]
) -> dict[Window, int]:
    """Rows of raw at `version` per window, counting only batch ids above the window's bound (0: all rows).

    One scan for all windows, so a backfill over many windows costs one query, not one per window.
    """
    if not after_batch:
        return {}
    values = ", ".join(f"({w.start_ms}, {w.end_ms}, {bound})" for w, bound in after_batch.items())
    rows = spark.sql(
        f"SELECT w.s, count(r.event_time) AS n FROM (VALUES {values}) AS w(s, e, after) "
        f"LEFT JOIN (SELECT event_time, batch_id FROM delta.`{raw_path}` VERSION AS OF {version} "
        f"WHERE {range_filter(raw_path, list(after_batch))}) r "
        "ON r.event_time >= timestamp_millis(w.s) AND r.event_time < timestamp_millis(w.e) AND r.batch_id > w.after "
        "GROUP BY w.s"
    ).collect()
    by_start = {w.start_ms: w for w in after_batch}
    return {by_start[int(row["s"])]: int(row["n"]) for row in rows}


def rows_before(spark: SparkSession, raw_path: str, version: int, start_ms: int) -> int:
    """Rows of raw at `version` whose event time is before `start_ms`."""
    return int(spark.sql(
        f"SELECT count(*) AS n FROM delta.`{raw_path}` VERSION AS OF {version} WHERE event_time < "
        f"timestamp_millis({start_ms}) AND time_bucket <= {start_ms // bucket_ms(raw_path)}"
    ).collect()[0]["n"])
