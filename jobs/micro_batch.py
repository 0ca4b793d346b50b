"""One micro-batch of a source, end to end: land (or plan), ingest, then advance the checkpoint.

Each step is safe to crash in. A landed-but-uncommitted batch is replayed as it was; a batch that committed but
whose checkpoint did not advance is recognised by its Delta SetTransaction and skipped; redelivered messages are
deduplicated against the raw table.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession

from jobs.ingest import IngestResult, ingest_batch
from jobs.land import land_pubsub_batch, plan_file_batch, read_file_batch
from jobs.pipeline import FileSourceSpec, Pipeline
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

    Spark is asked for only once there is a batch, so an idle poll costs no session start-up.
    """
    plan = next_plan(pipeline, handles)
    if plan is None:
        return None
    spark = get_spark()
    result = ingest_batch(
        spark, pipeline, plan, landed_frame(spark, plan, handles), handles.raw_path, handles.dead_letter_path
    )
    crash_point("ingest.after_merge")
    advance_checkpoint(handles.checkpoints, plan, result)
    return result


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


def advance_checkpoint(checkpoints: CheckpointStore, plan: BatchPlan, result: IngestResult) -> None:
    checkpoint = checkpoints.load()
    if checkpoint.committed_batch >= plan.batch_id:
        return  # a concurrent attempt advanced it already
    checkpoint.committed_batch = plan.batch_id
    if result.max_event_time_ms is not None:
        checkpoint.max_event_time_ms = max(checkpoint.max_event_time_ms or 0, result.max_event_time_ms)
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
