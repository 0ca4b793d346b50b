"""The window asset of each output (`event_counts` for `events`): one partition per event-time window.

Materializing a partition computes that window's current pane (early before the window closes, final after) and
MERGEs it into `windows/<asset>`; a backfill over a range runs as one run, and each partition gets its own
metadata (records, keys, late records, pane, timing, raw version, watermark, lag). A final pane, once committed,
is published through the output's commit sequence; what the run leaves unfinished, `commit_sensor` finishes. A
window whose pinned input expired fails the run naming it, after the run's other windows were materialized.
"""

import time
from typing import Any

import dagster as dg

from onceflow.jobs.declare.declaration import BigQuerySink, Pipeline, WindowedOutput
from onceflow.jobs.declare.durations import window_cron
from onceflow.jobs.finalize_job import commit_context
from onceflow.jobs.ingest_job import raw_asset_key
from onceflow.jobs.publish.sinks import output_sinks, publish_closed
from onceflow.jobs.run_worker import record_worker
from onceflow.jobs.sources.reader import open_source, source_watermark_ms
from onceflow.jobs.table_metadata import table_metadata
from onceflow.jobs.windows.checks import duplicate_record_ids, output_mismatches, unaccounted_late
from onceflow.jobs.windows.panes import PARTITION_FORMAT, CloseStore, Window
from onceflow.jobs.windows.pinned_input import PinnedInputExpired
from onceflow.jobs.windows.transform import WindowResult, WindowsExpired, materialize_windows
from onceflow.resources.bigquery import BigQueryResource
from onceflow.resources.lake import LakeResource
from onceflow.resources.spark import SparkResource

COUNTS_MATCH_RAW = "counts_match_raw"
LATE_RECORDS_ACCOUNTED = "late_records_accounted"
NO_DUPLICATE_RECORD_IDS = "no_duplicate_record_ids"


def window_partitions(pipeline: Pipeline, output: WindowedOutput) -> dg.TimeWindowPartitionsDefinition:
    """One partition per window, keyed `%Y-%m-%d-%H:%M` (UTC), from the pipeline's `start_date` to the window
    still open now: a fixed start, so every process that loads the code location sees the same partitions."""
    return dg.TimeWindowPartitionsDefinition(
        start=f"{pipeline.start_date}-00:00",
        fmt=PARTITION_FORMAT,
        cron_schedule=window_cron(output.window_s),
        timezone="UTC",
        end_offset=1,
    )


def window_metadata(result: WindowResult, published: str) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "window": result.window.key,
        "pane": result.pane,
        "timing": result.timing,
        "closed": result.closed,
        "raw_version": result.raw_version,
        "records": result.records,
        "keys": result.rows,
        "dagster/row_count": result.rows,  # the partition's rows: one per key
        "late_records": result.late,
        "latest_raw_version": result.latest_raw_version,
        "published": published,
        "lost_commit_races": result.lost_races,
    }
    if result.records_before is not None:
        metadata["records_before_first_window"] = result.records_before
    if result.watermark_ms is not None:
        metadata["watermark_ms"] = result.watermark_ms
        metadata["watermark_lag_s"] = round(time.time() - result.watermark_ms / 1000, 3)
    return metadata


def build_window_asset(
    pipeline: Pipeline, output: WindowedOutput, freshness_policy: dg.FreshnessPolicy | None = None
) -> dg.AssetsDefinition:
    """The output's window asset; its checks are blocking, so one failing with ERROR severity fails the run (for a
    run failure sensor to route) after the windows were materialized and published."""
    key = dg.AssetKey(output.asset)
    checks = [
        dg.AssetCheckSpec(COUNTS_MATCH_RAW, asset=key, blocking=True, description="Per window: the table holds "
                          "exactly the transform of the raw table at the pane's pinned version, computed from all its rows."),
        dg.AssetCheckSpec(LATE_RECORDS_ACCOUNTED, asset=key, blocking=True, description="Per closed window: raw rows "
                          "now = records at the close + late records."),
        dg.AssetCheckSpec(NO_DUPLICATE_RECORD_IDS, asset=key, blocking=True, description="No record ID twice in raw "
                          "within the dedup horizon, among the rows of the time buckets the run's windows overlap (the "
                          "daily `maintain_tables` job audits the whole horizon); under at-least-once delivery a "
                          "warning, which does not block."),
    ]

    @dg.asset(
        key=key,
        description=output.description or f"`{output.asset}` of pipeline `{pipeline.name}` per "
        f"{output.window} event-time window: the Delta table `{output.table}`.",
        partitions_def=window_partitions(pipeline, output),
        backfill_policy=dg.BackfillPolicy.single_run(),
        deps=[raw_asset_key(pipeline)],
        group_name=pipeline.name,
        kinds={"delta", "spark"},
        pool=f"onceflow_windows_{output.asset}",
        check_specs=checks,
        freshness_policy=freshness_policy,
    )
    def window_asset(
        context: dg.AssetExecutionContext,
        onceflow_spark: SparkResource,
        onceflow_lake: LakeResource,
        onceflow_bigquery: BigQueryResource,
    ):
        record_worker(context)
        session = onceflow_spark.get_session()
        lake = onceflow_lake
        raw_path, windows_path = lake.table_path(pipeline.raw_table), lake.table_path(output.table)
        watermark = source_watermark_ms(open_source(pipeline, lake).checkpoints.load())
        closes = CloseStore(lake.panes(), output.asset)
        windows = [Window.from_partition_key(k, output.window_s) for k in context.partition_keys]
        expired = None
        try:
            results = materialize_windows(session, pipeline, output, windows, watermark, closes, raw_path, windows_path)
        except WindowsExpired as error:
            results, expired = error.results, error

        sinks = output_sinks(output, lake.sink_root(), lake.staging_root(), _bigquery_project(output, onceflow_bigquery))
        run = context.run
        commits = publish_closed(session, commit_context(lake, onceflow_bigquery), output, sinks, windows_path,
                                 results, run.run_id, run.root_run_id or run.run_id)
        table = table_metadata(windows_path, output.table)
        for result in results:
            commit = commits.get(result.window.key)
            if commit is not None and commit.error:
                context.log.warning(f"{commit.sequence_id}: {commit.error}; commit_sensor will retry it")
            context.log.info(
                f"{output.asset} {result.window.key}: pane {result.pane} ({result.timing}) from raw v"
                f"{result.raw_version}: {result.records} records, {result.rows} rows, {result.late} late"
            )
            published = commit.outcome if commit is not None else "not closed"
            metadata = {**window_metadata(result, published), **table}
            if expired is None:
                context.add_asset_metadata(metadata, partition_key=result.window.key)
            else:  # the run fails for the expired windows: the others are recorded one by one
                yield dg.AssetMaterialization(key, partition=result.window.key, metadata=metadata)
        if expired is not None:
            raise PinnedInputExpired(str(expired)) from None  # its message names every expired window

        mismatched = output_mismatches(session, pipeline, output, raw_path, windows_path, results)
        unaccounted = unaccounted_late(session, raw_path, results)
        duplicates = duplicate_record_ids(session, raw_path, pipeline.dedup_horizon_s, watermark,
                                          [r.window for r in results])
        yield dg.MaterializeResult()
        yield dg.AssetCheckResult(
            check_name=COUNTS_MATCH_RAW, passed=not mismatched, severity=dg.AssetCheckSeverity.ERROR,
            metadata={"mismatched_windows": mismatched, "windows": len(results)},
        )
        yield dg.AssetCheckResult(
            check_name=LATE_RECORDS_ACCOUNTED,
            passed=not unaccounted,
            severity=dg.AssetCheckSeverity.ERROR,
            metadata={"unaccounted_windows": unaccounted, "late_records": sum(r.late for r in results)},
        )
        exactly_once = pipeline.delivery == "exactly_once"
        yield dg.AssetCheckResult(
            check_name=NO_DUPLICATE_RECORD_IDS,
            passed=duplicates == 0 or not exactly_once,
            severity=dg.AssetCheckSeverity.ERROR if exactly_once else dg.AssetCheckSeverity.WARN,
            metadata={"duplicate_record_ids": duplicates, "delivery": pipeline.delivery},
        )

    return window_asset


def _bigquery_project(output: WindowedOutput, bigquery: BigQueryResource) -> str | None:
    """The project of the output's BigQuery sink, with its dataset created; None without a BigQuery sink."""
    sink = next((s for s in output.sinks if isinstance(s, BigQuerySink)), None)
    if sink is None or sink.dataset is None:
        return None
    return bigquery.ensure_dataset(sink.dataset, sink.project)
