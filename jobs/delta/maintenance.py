"""Table maintenance that never breaks exactly-once or a backfill: retention, compaction, vacuum.

Every table keeps its old versions (log entries and the data files they reference) for the pipeline's
`retention`: time travel to a closed window's pinned version, what a retry or a backfill recomputes from, works
for that long after the window closed. `maintain` then

- sets the retention on every table of the pipeline (tables made before a change keep up);
- compacts the raw table only in time buckets below the dedup horizon: no MERGE inserts there any more (records
  that old are dead letters), so compaction never conflicts with ingest;
- compacts each window table whole: every window step's MERGE adds a small file (1,440 a day for 1-minute
  windows), and a new driver's first MERGE loads them all (a classic run's window step, which slows with their
  number). A window MERGE that loses a race with it merges again, and so does the compaction;
- compacts the dead-letter table whole (it is not partitioned): a batch with one bad record adds a file to it. A
  dead-letter append decided on the version before a compaction fails and is decided again, like any append that
  lost a race (`onceflow.jobs.ingest.batch_commit.commit_once`); the ID filters skip a compaction's files, which
  hold rows already counted (`onceflow.jobs.dedup.log_ids`);
- vacuums every table with exactly that retention: files removed within it stay, so every version within it
  stays readable;
- removes the staging logs that appends over Spark Connect killed mid-write left (`onceflow.jobs.delta.staging`),
  once older than an hour: no attempt runs that long.

A closed window older than the retention is not recomputed: `check_pinned_input` says why, naming the window,
its version and when it closed. Its published result stands.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import SparkSession

from onceflow.jobs.declare.declaration import Pipeline
from onceflow.jobs.delta.raw_table import bucket_ms
from onceflow.jobs.delta.staging import remove_abandoned_staging
from onceflow.jobs.delta.transactions import is_concurrent_commit, table_properties

ABANDONED_AFTER_S = 3_600
COMPACT_TRIES = 3


@dataclass(frozen=True)
class MaintenanceReport:
    table: str
    compacted_below_bucket: int | None
    vacuumed: bool
    staging_logs_removed: int
    compacted_whole: bool = False


def maintain(
    spark: SparkSession, pipeline: Pipeline, tables: dict[str, str], horizon_floor_ms: int | None
) -> list[MaintenanceReport]:
    """Maintain the pipeline's tables (`{name: path}`; the raw one named `raw`); see the module docstring."""
    hours = max(1, -(-pipeline.retention_s // 3600))  # as `table_properties` keeps them: whole hours, up
    properties = ", ".join(f"'{key}' = '{value}'" for key, value in table_properties(pipeline.retention_s).items())
    reports = []
    for name, path in tables.items():
        if not _exists(spark, path):
            continue
        spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ({properties})")
        below = None
        if name == "raw" and horizon_floor_ms is not None:
            below = horizon_floor_ms // bucket_ms(path)
            spark.sql(f"OPTIMIZE delta.`{path}` WHERE time_bucket < {below}")
        whole = name != "raw"
        if whole:
            _compact(spark, path)
        _vacuum(spark, path, hours)
        reports.append(MaintenanceReport(name, below, True, remove_abandoned_staging(path, ABANDONED_AFTER_S), whole))
    return reports


def _compact(spark: SparkSession, path: str) -> None:
    """OPTIMIZE a table whole, again when a writer committed first (a writer that loses to it retries itself)."""
    for attempt in range(COMPACT_TRIES):
        try:
            spark.sql(f"OPTIMIZE delta.`{path}`")
            return
        except Exception as error:
            if not is_concurrent_commit(error) or attempt == COMPACT_TRIES - 1:
                raise


def _vacuum(spark: SparkSession, path: str, hours: int) -> None:
    # Delta refuses to vacuum within 7 days unless told: its guard protects writers that run longer than the
    # retention. onceflow's writers are micro-batches and window runs of minutes, and a pipeline that declares a
    # shorter retention has chosen it.
    check = "spark.databricks.delta.retentionDurationCheck.enabled"
    spark.conf.set(check, str(hours >= 168).lower())
    try:
        spark.sql(f"VACUUM delta.`{path}` RETAIN {hours} HOURS")
    finally:
        spark.conf.unset(check)


def _exists(spark: SparkSession, path: str) -> bool:
    try:
        spark.sql(f"DESCRIBE DETAIL delta.`{path}`").collect()
    except Exception as error:
        if "DELTA_MISSING_DELTA_TABLE" in str(error) or "is not a Delta table" in str(error):
            return False
        raise
    return True
