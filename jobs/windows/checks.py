"""The checks behind a window asset's asset checks: facts recomputed from the raw table, compared with what the
materialization wrote.

- `output_mismatches`: per window, the window table holds exactly the transform of `raw VERSION AS OF` the pane's
  version (recomputed, compared row for row with EXCEPT ALL), and the records the pane was computed from number
  the raw rows of the window at that version.
- `unaccounted_late`: per closed window, the raw rows now = the records at the close + the late ones.
- `duplicate_record_ids`: record IDs twice in raw within the dedup horizon below the watermark; a window run asks
  only about the time buckets its windows overlap, which costs the same however long the horizon (a count of
  distinct IDs over the whole horizon grows with it, and would run every minute for 1-minute windows), and the daily
  `maintain_tables` job audits the whole horizon.
"""

from __future__ import annotations

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from onceflow.jobs.declare.declaration import Pipeline, WindowedOutput
from onceflow.jobs.windows.panes import Window
from onceflow.jobs.windows.raw_counts import bucket_filter, rows_per_window
from onceflow.jobs.windows.transform import WindowResult, pane_frame


def output_mismatches(
    spark: SparkSession,
    pipeline: Pipeline,
    output: WindowedOutput,
    raw_path: str,
    windows_path: str,
    results: list[WindowResult],
) -> list[str]:
    """Window keys whose table rows or input count disagree with a recomputation from the pinned raw version."""
    bad: set[str] = set()
    by_version: dict[int, list[WindowResult]] = {}
    for result in results:
        by_version.setdefault(result.raw_version, []).append(result)
    table = spark.read.format("delta").load(windows_path)
    for version, group in by_version.items():
        counts = rows_per_window(spark, raw_path, version, {r.window: 0 for r in group})
        bad |= {r.window.key for r in group if counts[r.window] != r.records}
        _, expected = pane_frame(
            spark, pipeline, output, raw_path, version, [(r.window, r.pane, r.timing) for r in group]
        )
        starts = [F.timestamp_millis(F.lit(r.window.start_ms)) for r in group]
        # By name: a column added to the table later sits at its end, and EXCEPT ALL compares by position.
        held = table.filter(F.col("window_start").isin(*starts)).select(*expected.columns)
        differing = expected.exceptAll(held).unionByName(held.exceptAll(expected))
        keys = {r.window.start_ms: r.window.key for r in group}
        for row in differing.select(F.expr("unix_millis(window_start) AS s")).distinct().collect():
            bad.add(keys[int(row["s"])])
    return sorted(bad)


def unaccounted_late(spark: SparkSession, raw_path: str, results: list[WindowResult]) -> list[str]:
    """Closed windows whose raw rows now are not the records they were computed from plus the late ones."""
    if not results:
        return []
    now = rows_per_window(spark, raw_path, results[0].latest_raw_version, {r.window: 0 for r in results})
    return [r.window.key for r in results if r.closed and now[r.window] != r.records + r.late]


class DuplicateRecordIds(RuntimeError):
    """An exactly-once pipeline's raw table holds some record ID twice within its dedup horizon."""


def duplicate_record_ids(
    spark: SparkSession, raw_path: str, horizon_s: int, watermark_ms: int | None, windows: list[Window] | None = None
) -> int:
    """Record IDs that occur more than once in raw within the dedup horizon (before the watermark); with `windows`,
    among the rows of the time buckets they overlap only: a redelivered record carries its event time, so its
    bucket; two records of one ID in different buckets are left to the whole horizon's audit."""
    where = [f"event_time >= timestamp_millis({watermark_ms - horizon_s * 1000})"] if watermark_ms else []
    if windows is not None:
        if not windows:
            return 0
        where.append(bucket_filter(raw_path, windows))
    condition = f"WHERE {' AND '.join(where)}" if where else ""
    row = spark.sql(f"SELECT count(*) - count(DISTINCT record_id) AS d FROM delta.`{raw_path}` {condition}").collect()
    return int(row[0]["d"])
