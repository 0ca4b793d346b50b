"""The window asset of a pipeline (`event_counts` for `events`): one partition per event-time window.

Materializing a partition computes that window's current pane (early before the window closes, final after) and
MERGEs it into `windows/<asset>`; a backfill over a range runs as one run. A final pane, once committed, is
published: its commit sequence (file sink, BigQuery when configured, high watermark) is written ahead, then run
once by this run; what this run leaves unfinished, `commit_sensor` finishes. The asset checks reconcile the window
table against the raw table at the pinned version, and the raw table against itself for duplicate record IDs.
"""

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import dagster as dg
from pyspark.sql import SparkSession

from jobs.commit_steps import run_sequence
from jobs.finalize_job import commit_context
from jobs.ingest_job import raw_asset_key
from jobs.micro_batch import source_watermark_ms
from jobs.pipeline import Pipeline
from jobs.publish import BigQueryTarget, publish_pane
from jobs.windows import (
    PARTITION_FORMAT,
    CloseStore,
    Window,
    WindowResult,
    materialize_windows,
    pane_rows,
    rows_per_window,
)
from resources.bigquery import BigQueryResource
from resources.checkpoint import CheckpointStore
from resources.lake import LakeResource
from resources.spark import SparkResource

COUNTS_MATCH_RAW = "counts_match_raw"
LATE_RECORDS_ACCOUNTED = "late_records_accounted"
NO_DUPLICATE_RECORD_IDS = "no_duplicate_record_ids"


def window_partitions(pipeline: Pipeline, start: str | None = None) -> dg.TimeWindowPartitionsDefinition:
    """One partition per window, keyed `%Y-%m-%d-%H:%M` (UTC), the still-open window included.

    The first partition is `start` (same format) or midnight 30 days ago, which keeps the partition count far
    below Dagster's comfortable limit (~43,000 one-minute windows plus the days since).
    """
    if start is None:
        start = (datetime.now(UTC) - timedelta(days=30)).strftime("%Y-%m-%d-00:00")
    minutes = pipeline.window_s // 60
    return dg.TimeWindowPartitionsDefinition(
        start=start,
        fmt=PARTITION_FORMAT,
        cron_schedule="* * * * *" if minutes == 1 else f"*/{minutes} * * * *",
        timezone="UTC",
        end_offset=1,
    )


def window_metadata(result: WindowResult) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "window": result.window.key,
        "pane": result.pane,
        "timing": result.timing,
        "closed": result.closed,
        "raw_version": result.raw_version,
        "records": result.records,
        "keys": result.keys,
        "late_records": result.late,
        "latest_raw_version": result.latest_raw_version,
    }
    if result.watermark_ms is not None:
        metadata["watermark_ms"] = result.watermark_ms
        metadata["watermark_lag_s"] = round(time.time() - result.watermark_ms / 1000, 3)
    return metadata


def window_table_counts(spark: SparkSession, windows_path: str, windows: list[Window]) -> dict[Window, int]:
    """sum(count) per window as the window table holds it now."""
    starts = ", ".join(str(w.start_ms) for w in windows)
    rows = spark.sql(
        f"SELECT unix_millis(window_start) AS s, sum(count) AS n FROM delta.`{windows_path}` "
        f"WHERE unix_millis(window_start) IN ({starts}) GROUP BY window_start"
    ).collect()
    found = {int(r["s"]): int(r["n"]) for r in rows}
    return {w: found.get(w.start_ms, 0) for w in windows}


def duplicate_record_ids(spark: SparkSession, raw_path: str, pipeline: Pipeline, watermark_ms: int | None) -> int:
    """Record IDs that occur more than once in raw within the dedup horizon (before the watermark)."""
    floor = f"WHERE event_time >= timestamp_millis({watermark_ms - pipeline.dedup_horizon_s * 1000})" if watermark_ms else ""
    row = spark.sql(f"SELECT count(*) - count(DISTINCT record_id) AS d FROM delta.`{raw_path}` {floor}").collect()[0]
    return int(row["d"])


def bigquery_target(pipeline: Pipeline, bigquery: BigQueryResource) -> BigQueryTarget | None:
    """Where the pipeline's windows go in BigQuery (table named after the asset), None when BigQuery is off."""
    if bigquery.dataset is None:
        return None
    bigquery.ensure_dataset()
    with bigquery.get_client() as client:
        project = client.project
    return BigQueryTarget(project, bigquery.dataset, pipeline.window_asset.replace("/", "_"))


def publish_closed(
    context: dg.AssetExecutionContext,
    session: SparkSession,
    pipeline: Pipeline,
    lake: LakeResource,
    bigquery: BigQueryResource,
    results: list[WindowResult],
) -> dict[str, str]:
    """Publish the final pane of every closed window in `results`; the outcome per window key.

    A failed publication does not fail the materialization (the window table is committed): the sequence stays
    pending and `commit_sensor` launches the next attempt.
    """
    closed = [r for r in results if r.closed]
    if not closed:
        return {}
    ctx = commit_context(lake, bigquery)
    target = bigquery_target(pipeline, bigquery)
    windows_path = lake.table_path(pipeline.windows_table)
    run = context.run
    outcomes = {}
    for result in closed:
        published = publish_pane(
            ctx.store,
            asset=pipeline.window_asset,
            window=result.window,
            pane=result.pane,
            rows=pane_rows(session, windows_path, result.window, result.pane),
            sink_root=lake.sink_root(),
            bigquery=target,
        )
        commit = run_sequence(ctx, published.sequence.id, run.run_id, run.root_run_id or run.run_id)
        outcomes[result.window.key] = commit.outcome
        if commit.error:
            context.log.warning(f"{published.sequence.id}: {commit.error}; commit_sensor will retry it")
    return outcomes


def build_window_asset(pipeline: Pipeline, start: str | None = None) -> dg.AssetsDefinition:
    key = dg.AssetKey(pipeline.window_asset)

    @dg.asset(
        key=key,
        description=(
            f"Per {pipeline.window_s}s event-time window and key of `{pipeline.name}`: count and sum of value, "
            f"computed from a pinned version of the raw table; the Delta table `{pipeline.windows_table}`."
        ),
        partitions_def=window_partitions(pipeline, start),
        backfill_policy=dg.BackfillPolicy.single_run(),
        deps=[raw_asset_key(pipeline)],
        group_name=pipeline.name,
        kinds={"delta", "spark"},
        pool=f"onceflow_windows_{pipeline.name}",
        check_specs=[
            dg.AssetCheckSpec(COUNTS_MATCH_RAW, asset=key, description="Per window: sum(count) = raw rows at v."),
            dg.AssetCheckSpec(
                LATE_RECORDS_ACCOUNTED, asset=key, description="Per closed window: raw rows now = counted + late."
            ),
            dg.AssetCheckSpec(
                NO_DUPLICATE_RECORD_IDS, asset=key, description="No record ID twice in raw within the dedup horizon."
            ),
        ],
    )
    def window_asset(
        context: dg.AssetExecutionContext, spark: SparkResource, lake: LakeResource, bigquery: BigQueryResource
    ):
        session = spark.get_session()
        raw_path, windows_path = lake.table_path(pipeline.raw_table), lake.table_path(pipeline.windows_table)
        watermark = source_watermark_ms(CheckpointStore(lake.checkpoints(), pipeline.source_id).load())
        closes = CloseStore(lake.checkpoints(), pipeline.window_asset)
        windows = [Window.from_partition_key(k, pipeline.window_s) for k in context.partition_keys]
        results = materialize_windows(session, pipeline, windows, watermark, closes, raw_path, windows_path)
        for result in results:
            context.log.info(
                f"{pipeline.window_asset} {result.window.key}: pane {result.pane} ({result.timing}) from raw v"
                f"{result.raw_version}: {result.records} records, {result.keys} keys, {result.late} late"
            )

        published = publish_closed(context, session, pipeline, lake, bigquery, results)
        in_table = window_table_counts(session, windows_path, windows)
        at_close: dict[Window, int] = {}
        for version in {r.raw_version for r in results}:
            at_close |= rows_per_window(session, raw_path, version, {r.window: 0 for r in results if r.raw_version == version})
        mismatched = [r.window.key for r in results if in_table[r.window] != at_close[r.window]]
        now = rows_per_window(session, raw_path, results[0].latest_raw_version, {r.window: 0 for r in results})
        unaccounted = [r.window.key for r in results if r.closed and now[r.window] != r.records + r.late]
        duplicates = duplicate_record_ids(session, raw_path, pipeline, watermark)
        if len(results) == 1:
            metadata = window_metadata(results[0])
            metadata["published"] = published.get(results[0].window.key, "not closed")
        else:
            metadata = {
                "windows": len(results),
                "records": sum(r.records for r in results),
                "late_records": sum(r.late for r in results),
                "closed_windows": sum(r.closed for r in results),
                "published_windows": sum(o in ("done", "already_done") for o in published.values()),
            }
        yield dg.MaterializeResult(metadata=metadata)
        yield dg.AssetCheckResult(
            check_name=COUNTS_MATCH_RAW, passed=not mismatched, metadata={"mismatched_windows": mismatched}
        )
        yield dg.AssetCheckResult(
            check_name=LATE_RECORDS_ACCOUNTED,
            passed=not unaccounted,
            metadata={"unaccounted_windows": unaccounted, "late_records": sum(r.late for r in results)},
        )
        yield dg.AssetCheckResult(
            check_name=NO_DUPLICATE_RECORD_IDS,
            passed=duplicates == 0 or pipeline.delivery == "at_least_once",
            severity=dg.AssetCheckSeverity.ERROR if pipeline.delivery == "exactly_once" else dg.AssetCheckSeverity.WARN,
            metadata={"duplicate_record_ids": duplicates, "delivery": pipeline.delivery},
        )

    return window_asset
