"""One micro-batch of a source, end to end: plan (and land), ingest, then advance the checkpoint.

Each step is safe to crash in. A landed-but-uncommitted batch is replayed as it was; a batch that committed but
whose checkpoint did not advance is recognised by its Delta SetTransaction and skipped; redelivered messages are
deduplicated against the raw table.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from pyspark.sql import SparkSession

from jobs.ingest import IngestResult, ingest_batch
from jobs.source_reader import SourceRuntime, source_watermark_ms
from resources.checkpoint import BatchPlan, CheckpointStore, SourceCheckpoint
from resources.faults import crash_point


def run_micro_batch(get_spark: Callable[[], SparkSession], source: SourceRuntime) -> IngestResult | None:
    """Land and ingest the next batch of the source; None when the source has no new data.

    Either way the source's watermark is brought up to date and persisted with the checkpoint (an idle source's
    watermark advances too). Spark is asked for only once there is a batch, so an idle poll costs no Spark work.
    """
    pipeline, reader = source.pipeline, source.reader
    checkpoint = source.checkpoints.load()
    watermark = reader.watermark(checkpoint.watermark)
    reader.before_batch(watermark, _now_ms())
    plan = reader.next_plan(checkpoint, horizon_floor_ms(pipeline.delivery, pipeline.dedup_horizon_s, checkpoint))
    if plan is None:
        watermark.current(_now_ms())
        checkpoint.watermark = watermark.to_state()
        source.checkpoints.save(checkpoint)
        return None
    spark = get_spark()
    result = ingest_batch(
        spark, pipeline, plan, reader.landed(spark, plan), source.raw_path, source.dead_letter_path
    )
    crash_point("ingest.after_merge")
    reader.after_commit(watermark, plan, result, _now_ms())
    watermark.current(_now_ms())
    advance_checkpoint(source.checkpoints, plan, result, watermark.to_state())
    return result


def horizon_floor_ms(delivery: str, dedup_horizon_s: int, checkpoint: SourceCheckpoint) -> int | None:
    """Records older than this cannot be checked against the dedup catalog any more.

    The floor follows the source's watermark, never the largest event time seen: one record with an absurd
    timestamp cannot move it (and a future one is dead-lettered before it reaches the watermark).
    """
    watermark = source_watermark_ms(checkpoint)
    if delivery != "exactly_once" or watermark is None:
        return None
    return watermark - dedup_horizon_s * 1000


def _now_ms() -> int:
    return int(time.time() * 1000)


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
