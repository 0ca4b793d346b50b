"""One micro-batch of a source, end to end: land (or plan), ingest, then advance the checkpoint.

Each step is safe to crash in. A landed-but-uncommitted batch is replayed as it was; a batch that committed but
whose checkpoint did not advance is recognised by its Delta SetTransaction and skipped; redelivered messages are
deduplicated against the raw table.
"""

from __future__ import annotations

import io
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession

from jobs.ingest import IngestResult, ingest_batch
from jobs.land import land_pubsub_batch, plan_file_batch, read_file_batch
from jobs.pipeline import FileSourceSpec, Pipeline, PubSubSourceSpec
from jobs.tracking import TrackingDrainer
from jobs.watermark import (
    CloudMonitoringBacklogProbe,
    EmulatorBacklogProbe,
    FileWatermark,
    PubSubWatermark,
    WatermarkSettings,
)
from resources.checkpoint import BatchPlan, CheckpointStore, SourceCheckpoint
from resources.faults import crash_point
from resources.files import FileSource
from resources.lake import LakeResource
from resources.object_store import ObjectStore
from resources.pubsub import PubSubClient


@dataclass
class SourceHandles:
    """What a micro-batch touches outside Spark: the source, its checkpoints, the landing area, the tables."""

    checkpoints: CheckpointStore
    landing: ObjectStore
    raw_path: str
    dead_letter_path: str
    pubsub: PubSubClient | None = None
    files: FileSource | None = None


def source_handles(pipeline: Pipeline, lake: LakeResource, pubsub: PubSubClient | None) -> SourceHandles:
    """Wire a pipeline's source to its checkpoints, landing area and tables under the lake."""
    spec = pipeline.source
    return SourceHandles(
        checkpoints=CheckpointStore(lake.checkpoints(), pipeline.source_id),
        landing=lake.landing(),
        raw_path=lake.table_path(pipeline.raw_table),
        dead_letter_path=lake.table_path(pipeline.dead_letter_table),
        pubsub=None if isinstance(spec, FileSourceSpec) else pubsub,
        files=FileSource(spec.directory, spec.pattern) if isinstance(spec, FileSourceSpec) else None,
    )


def run_micro_batch(
    get_spark: Callable[[], SparkSession], pipeline: Pipeline, handles: SourceHandles
) -> IngestResult | None:
    """Land and ingest the next batch of the pipeline's source; None when the source has no new data.

    Either way the source's watermark is brought up to date and persisted with the checkpoint (an idle source's
    watermark advances too). Spark is asked for only once there is a batch, so an idle poll costs no Spark work.
    """
    checkpoint = handles.checkpoints.load()
    watermark = watermark_estimator(pipeline, handles).from_state(checkpoint.watermark)
    if isinstance(watermark, PubSubWatermark):
        assert handles.pubsub is not None and isinstance(pipeline.source, PubSubSourceSpec)
        drained = TrackingDrainer.for_source(handles.pubsub, pipeline.source).drain(_now_ms())
        watermark.observe(drained.samples, drained.tracked_through_ms)
    plan = next_plan(pipeline, handles)
    if plan is None:
        watermark.current(_now_ms())
        checkpoint.watermark = watermark.to_state()
        handles.checkpoints.save(checkpoint)
        return None
    spark = get_spark()
    result = ingest_batch(
        spark, pipeline, plan, landed_frame(spark, plan, handles), handles.raw_path, handles.dead_letter_path
    )
    crash_point("ingest.after_merge")
    if isinstance(watermark, PubSubWatermark):
        watermark.committed(landed_messages(plan, handles.landing))
    else:
        watermark.observe(result.max_event_time_ms, _now_ms())
    watermark.current(_now_ms())
    advance_checkpoint(handles.checkpoints, plan, result, watermark.to_state())
    return result


def watermark_estimator(pipeline: Pipeline, handles: SourceHandles) -> PubSubWatermark | FileWatermark:
    """The source's estimator: files by out-of-orderness bound; Pub/Sub by Dataflow's tracking heuristic.

    The Pub/Sub base subscription's backlog comes from Cloud Monitoring on GCP; the emulator has no such metric,
    so there it is estimated from what onceflow itself has committed.
    """
    spec = pipeline.source
    settings = WatermarkSettings.from_env()
    settings = WatermarkSettings(
        band_ms=settings.band_ms if pipeline.watermark_band_s is None else round(pipeline.watermark_band_s * 1000),
        idle_timeout_ms=(
            settings.idle_timeout_ms if pipeline.watermark_idle_s is None else round(pipeline.watermark_idle_s * 1000)
        ),
    )
    if isinstance(spec, FileSourceSpec):
        return FileWatermark.for_source(spec, settings)
    assert handles.pubsub is not None
    if os.environ.get("PUBSUB_EMULATOR_HOST"):
        probe: EmulatorBacklogProbe | CloudMonitoringBacklogProbe = EmulatorBacklogProbe()
    else:
        probe = CloudMonitoringBacklogProbe(handles.pubsub.project, spec.subscription)
    return PubSubWatermark.from_settings(probe, settings)


def landed_messages(plan: BatchPlan, landing: ObjectStore) -> list[tuple[str, int]]:
    """(message id, publish time) of every message in a landed Pub/Sub batch."""
    assert plan.landing_key is not None
    data = landing.read(plan.landing_key)
    assert data is not None
    table = pq.read_table(io.BytesIO(data), columns=["source_position", "publish_time"])
    times = table.column("publish_time").cast(pa.int64()).to_pylist()
    return list(zip(table.column("source_position").to_pylist(), times, strict=True))


def _now_ms() -> int:
    return int(time.time() * 1000)


def source_watermark_ms(checkpoint: SourceCheckpoint) -> int | None:
    """The source's event-time watermark as of its last checkpoint, None before any."""
    value = checkpoint.watermark.get("watermark_ms")
    return None if value is None else int(value)


def next_plan(pipeline: Pipeline, handles: SourceHandles) -> BatchPlan | None:
    if isinstance(pipeline.source, FileSourceSpec):
        assert handles.files is not None
        return plan_file_batch(pipeline, handles.files, handles.checkpoints)
    assert handles.pubsub is not None
    return land_pubsub_batch(pipeline, handles.pubsub, handles.checkpoints, handles.landing)


def landed_frame(spark: SparkSession, plan: BatchPlan, handles: SourceHandles) -> DataFrame:
    if plan.kind == "files":
        assert handles.files is not None
        return spark.createDataFrame(read_file_batch(plan, handles.files))
    assert plan.landing_key is not None
    return spark.read.parquet(handles.landing.url(plan.landing_key))


def advance_checkpoint(
    checkpoints: CheckpointStore, plan: BatchPlan, result: IngestResult, watermark: dict[str, Any]
) -> None:
    checkpoint = checkpoints.load()
    if checkpoint.committed_batch >= plan.batch_id:
        return  # a concurrent attempt advanced it already
    checkpoint.committed_batch = plan.batch_id
    checkpoint.watermark = watermark
    if result.max_event_time_ms is not None:
        checkpoint.max_event_time_ms = max(checkpoint.max_event_time_ms or 0, result.max_event_time_ms)
    if result.min_event_time_ms is not None:
        checkpoint.min_event_time_ms = min(checkpoint.min_event_time_ms or result.min_event_time_ms,
                                           result.min_event_time_ms)
        recent = [*checkpoint.recent_batches, (plan.batch_id, result.min_event_time_ms)]
        checkpoint.recent_batches = recent[-SourceCheckpoint.RECENT_BATCHES :]
    checkpoint.taken_files.update({f.path: f for f in plan.files})
    for name, count in (
        ("received", result.received),
        ("inserted", result.inserted),
        ("duplicates", result.duplicates),
        ("dead_lettered", result.dead_lettered_total),
    ):
        checkpoint.totals[name] = checkpoint.totals.get(name, 0) + count
    checkpoint.updated_at_ms = int(time.time() * 1000)
    checkpoints.save(checkpoint)
