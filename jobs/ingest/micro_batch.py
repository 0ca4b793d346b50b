"""One micro-batch of a source, end to end: plan (and land), ingest, then advance the checkpoint.

Each step is safe to crash in, and to overlap with another attempt at the same batch. A landed-but-uncommitted
batch is replayed as it was; a batch that committed but whose checkpoint did not advance is recognised by its
Delta SetTransaction and skipped; redelivered messages are deduplicated against the raw table. Every checkpoint
change is a compare-and-swap recomputed on the newest checkpoint, so an overlapping run never moves it back.

Batch numbers never trust the checkpoint alone: the next batch is above both the checkpoint's last one and the
SetTransaction version the lake holds for the source. A checkpoint lost or restored from an older copy is said
loudly (the `onceflow` logger, which Dagster records in the run) and numbering continues above the lake's.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from pyspark.sql import SparkSession

from onceflow.jobs.delta.commit_log import committed_batch, committed_metadata, committed_rows
from onceflow.jobs.ingest.batch_ingest import EVENT_TIMES_KEY, RECEIVED_KEY, ingest_batch
from onceflow.jobs.ingest.batch_read import read_batch, rows_to_driver
from onceflow.jobs.ingest.result import IngestResult
from onceflow.jobs.sources.checkpoint import BatchPlan, SourceCheckpoint
from onceflow.jobs.sources.reader import SourceReader, SourceRuntime, source_watermark_ms
from onceflow.jobs.sources.watermark import WatermarkEstimator
from onceflow.resources.faults import fault_point
from onceflow.resources.spark_functions import register_spark_functions

log = logging.getLogger("onceflow")
WIDE_BATCH_BUCKETS = 1000


def run_micro_batch(get_spark: Callable[[], SparkSession], source: SourceRuntime) -> IngestResult | None:
    """Land and ingest the next batch of the source; None when the source has no new data.

    Either way the source's watermark is brought up to date and persisted with the checkpoint (an idle source's
    watermark advances too). Spark is asked for only once there is a batch, so an idle poll costs no Spark work.
    What the watermark learns before a batch (Pub/Sub: a drain of the tracking subscription, about a second on
    the emulator) is taken beside the batch's landing and ingest: only the checkpoint update needs it.
    """
    pipeline, reader = source.pipeline, source.reader
    start = time.perf_counter()
    with ThreadPoolExecutor(1, thread_name_prefix="onceflow-watermark") as pool:
        learnt = pool.submit(reader.before_batch, _now_ms())
        checkpoint, realigned_from = align_with_lake(source)
        floor = horizon_floor_ms(pipeline.delivery, pipeline.dedup_horizon_s, checkpoint)
        plan = reader.next_plan(checkpoint, floor, source.read_ahead.proposal)
        waiting = time.perf_counter()
        ahead = source.read_ahead.take(plan)
        waited = time.perf_counter() - waiting
        if plan is None:
            learnt.result()
            source.checkpoints.update(lambda c: _with_watermark(reader, c))
            return None
        fault_point("ingest.after_plan")
        spark = get_spark()
        register_spark_functions(spark)
        waiting = time.perf_counter()
        read = ahead or read_batch(spark, source, plan, reader.landed(spark, plan))
        waited += time.perf_counter() - waiting
        result = ingest_batch(spark, source, plan, read, functools.partial(_read_next, spark, source, checkpoint, plan))
        result.realigned_from, result.read_ahead = realigned_from, ahead is not None
        result.times.add("read", read.seconds)
        result.times.add("read_wait", waited)
        if result.lost_race:
            log.warning(f"{source.app_id} batch {plan.batch_id}: a concurrent attempt committed it first; this "
                        "run wrote nothing and counts that commit's figures")
        _warn_if_wide(source, plan.batch_id, result)
        fault_point("ingest.after_merge")
        if result.replayed:  # another attempt committed it, perhaps under another plan: that one stands
            plan = committed_plan(source, plan)
        learnt.result()
        with result.times.stage("checkpoint"):
            recorded: list[bool] = []  # whether the change that stood recorded the batch (CAS may ask again)

            def record(c: SourceCheckpoint) -> SourceCheckpoint | None:
                changed = advanced(source, c, plan, result)
                recorded.append(changed is not None)
                return changed

            source.checkpoints.update(record)
            result.counted = recorded[-1]
        if not result.lost_race:
            reader.after_checkpoint(plan)
    result.times.add("batch", time.perf_counter() - start)
    return result


def _read_next(
    spark: SparkSession, source: SourceRuntime, checkpoint: SourceCheckpoint, plan: BatchPlan, result: IngestResult,
    after: Future | None,
) -> None:
    """Begin reading the batch after `plan` (`onceflow.jobs.sources.read_ahead`), as it would be planned once `plan`
    commits (`result`: its counts and event times so far), after `after` (its dead letters' commit)."""
    if not source.reader.reads_ahead or not rows_to_driver(source):  # else the batch's own Spark jobs come after
        return
    committed = advanced(source, checkpoint.copied(), plan, result)
    if committed is None:
        return
    floor = horizon_floor_ms(source.pipeline.delivery, source.pipeline.dedup_horizon_s, committed)
    proposal = source.checkpoints.get_plan(committed.next_batch) or source.reader.propose(committed, floor)
    if proposal is not None:
        source.read_ahead.begin(
            proposal, lambda: read_batch(spark, source, proposal, source.reader.landed(spark, proposal)), after
        )


def _warn_if_wide(source: SourceRuntime, batch_id: int, result: IngestResult) -> None:
    """A batch whose records span more than `WIDE_BATCH_BUCKETS` time buckets wrote a file for each (a backfill of
    months into hourly buckets ran at half the speed of daily ones): say so, and what to declare."""
    if result.min_event_time_ms is None or result.max_event_time_ms is None:
        return
    width = source.pipeline.time_bucket_ms
    spanned = result.max_event_time_ms // width - result.min_event_time_ms // width + 1
    if spanned > WIDE_BATCH_BUCKETS:
        log.warning(f"{source.app_id} batch {batch_id}: its records span {spanned} time buckets of "
                    f"{source.pipeline.time_bucket}, a file written for each; a pipeline whose batches span this "
                    "much event time is faster with a wider `time_bucket` (a table keeps its own: declare it for a "
                    "new one)")


def lake_batch(source: SourceRuntime) -> int:
    """The last batch of the source the lake has committed: the SetTransaction version its raw table holds.

    A batch commits its dead letters first and its raw rows last, so one the dead-letter table alone holds is not
    committed: its valid records are in no table yet (see `pending_batch`).
    """
    return committed_batch(source.raw_path, source.app_id) or 0


def lake_ahead(source: SourceRuntime, committed: int) -> bool:
    """Whether the lake holds a batch of the source after `committed` in either table: committed, or begun (its
    dead letters in) and to be replayed."""
    return max(lake_batch(source), committed_batch(source.dead_letter_path, source.app_id) or 0) > committed


def pending_batch(source: SourceRuntime, lake: int) -> None:
    """Make batch `lake + 1` replay as it was planned when its dead letters committed but its raw rows did not
    (the run died between the two commits) and the checkpoints lost its plan: the plan its commit carries is
    recorded again, so the next batch is that one, not a new one above it."""
    pending = lake + 1
    if (committed_batch(source.dead_letter_path, source.app_id) or 0) < pending:
        return
    if source.checkpoints.get_plan(pending) is not None:
        return
    plan = source.plans.plan_in(committed_metadata(source.dead_letter_path, source.app_id, [pending]).get(pending, {}))
    if plan is not None:
        source.checkpoints.plan(plan)


def align_with_lake(source: SourceRuntime) -> tuple[SourceCheckpoint, int | None]:
    """The checkpoint, moved up to the last batch the lake has committed for this source if it was behind; and
    the batch it said before, when it was behind (else None).

    The lake one batch ahead with that batch's plan at hand is the ordinary crash between the Delta commit and
    the checkpoint: the plan is replayed (a no-op in Delta) and advances the checkpoint as it should. Further
    ahead, or without the plan, the checkpoint was lost or restored from an older copy. What it skips is learnt
    back from the commits themselves: each carries its plan and its records' event-time range, so the watermark
    and the windows go on as if the checkpoint had never been behind.
    """
    lake = lake_batch(source)
    pending_batch(source, lake)
    checkpoint = source.checkpoints.load()
    next_batch = checkpoint.next_batch
    if lake == next_batch and (stored := source.checkpoints.get_plan(next_batch)) is not None:
        committed_plan(source, stored)
        return checkpoint, None
    if lake < next_batch:
        return checkpoint, None
    log.warning(
        f"{source.app_id}: the checkpoint's last committed batch is {checkpoint.committed_batch} but the lake has "
        f"committed batch {lake}: the checkpoint was lost or restored from an older copy. Numbering continues at "
        f"batch {lake + 1}; nothing committed is lost or written twice (`onceflow reset {source.pipeline.name}` "
        "starts a new epoch deliberately)"
    )
    carried = source.plans.metadatas(range(next_batch, lake + 1))

    def realign(c: SourceCheckpoint) -> SourceCheckpoint:
        watermark = source.reader.watermark(c.watermark)
        learn_committed(source, c, watermark, range(c.committed_batch + 1, lake + 1), carried)
        c.watermark = watermark.to_state()
        c.committed_batch = max(c.committed_batch, lake)
        return c

    return source.checkpoints.update(realign), checkpoint.committed_batch


def committed_plan(source: SourceRuntime, plan: BatchPlan) -> BatchPlan:
    """The plan the lake committed batch `plan.batch_id` with: `plan` itself, or the one its raw commit carries,
    which then replaces `plan` in the checkpoints, loudly. Two plans of one batch exist only when the checkpoints
    lost the first (restored from an older copy) while an attempt at it was still running: the batch is what its
    commit holds, and the files or offsets only the other plan listed are planned again."""
    committed = source.plans.plan_in(committed_metadata(source.raw_path, source.app_id, [plan.batch_id])
                                     .get(plan.batch_id, {}))
    if committed is None or committed == plan:
        return plan
    log.warning(f"{source.app_id} batch {plan.batch_id}: the lake committed it under another plan than the one "
                "the checkpoints held (restored from an older copy while an attempt was running); the checkpoints "
                "now hold the committed one, and what only the other listed is planned again")
    source.checkpoints.replace_plan(committed)
    return committed


def learn_committed(
    source: SourceRuntime, c: SourceCheckpoint, watermark: WatermarkEstimator, batches: range,
    carried: dict[int, dict],
) -> None:
    """Teach checkpoint `c` and its `watermark` the `batches` the lake has committed but `c` skips over, from what
    their commits carried (`carried`, by batch): their event times, files and messages leave the source's backlog
    as if each had advanced the checkpoint (else a backlog kept from what onceflow saw waits for them for ever)."""
    inserted = committed_rows(source.raw_path, source.app_id, batches)
    dead_lettered = committed_rows(source.dead_letter_path, source.app_id, batches)
    for batch in batches:
        metadata = carried.get(batch, {})
        if RECEIVED_KEY in metadata:  # its figures, as the batch's own attempt would have counted them
            received, new, dead = metadata[RECEIVED_KEY], inserted.get(batch, 0), dead_lettered.get(batch, 0)
            _count(c, received, new, received - new - dead, dead)
        times = metadata.get(EVENT_TIMES_KEY)
        if times is not None:
            with_event_times(c, batch, *times)
        plan = source.checkpoints.get_plan(batch) or source.plans.plan_in(metadata)
        if plan is None:
            continue
        c.took(plan.files)
        try:
            source.reader.after_commit(watermark, plan, _Realigned(times[1] if times else None), _now_ms())
        except FileNotFoundError:
            log.warning(f"{source.app_id} batch {batch}: its landing is gone; the watermark may wait for it")


@dataclass(frozen=True)
class _Realigned:
    """What the watermark learns from a batch found committed in the lake: the newest event time its commit
    carried (None from a commit made before commits carried it)."""

    max_event_time_ms: int | None
    stream_max_event_ms: dict[int, int] = field(default_factory=dict)


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


def _with_watermark(reader: SourceReader, checkpoint: SourceCheckpoint) -> SourceCheckpoint:
    watermark = reader.watermark(checkpoint.watermark)
    watermark.current(_now_ms())
    checkpoint.watermark = watermark.to_state()
    return checkpoint


def advanced(
    source: SourceRuntime, checkpoint: SourceCheckpoint, plan: BatchPlan, result: IngestResult
) -> SourceCheckpoint | None:
    """The checkpoint with batch `plan` committed; None if a concurrent attempt advanced it already, or if this
    attempt lost the commit race (the attempt whose commit holds the batch advances it with that commit's figures,
    or a later replay does if it died first).

    A checkpoint below the batch before this one went back while the batch ran (restored from an older copy):
    the batches between are committed (this one was planned above them), and are learnt from the lake first."""
    if checkpoint.committed_batch >= plan.batch_id or result.lost_race:
        return None
    reader = source.reader
    watermark = reader.watermark(checkpoint.watermark)
    skipped = range(checkpoint.committed_batch + 1, plan.batch_id)
    if skipped:
        learn_committed(source, checkpoint, watermark, skipped, source.plans.metadatas(skipped))
    reader.after_commit(watermark, plan, result, _now_ms())
    watermark.current(_now_ms())
    checkpoint.watermark = watermark.to_state()
    checkpoint.committed_batch = plan.batch_id
    if result.min_event_time_ms is not None and result.max_event_time_ms is not None:
        with_event_times(checkpoint, plan.batch_id, result.min_event_time_ms, result.max_event_time_ms)
    checkpoint.took(plan.files)
    _count(checkpoint, result.received, result.inserted, result.duplicates, result.dead_lettered_new)
    return checkpoint


def _count(checkpoint: SourceCheckpoint, received: int, inserted: int, duplicates: int, dead_lettered: int) -> None:
    """Add a batch's figures to the checkpoint's totals."""
    for name, count in (("received", received), ("inserted", inserted), ("duplicates", duplicates),
                        ("dead_lettered", dead_lettered)):
        checkpoint.totals[name] = checkpoint.totals.get(name, 0) + count


def with_event_times(checkpoint: SourceCheckpoint, batch_id: int, min_ms: int, max_ms: int) -> None:
    """Widen the checkpoint's event-time range by batch `batch_id`'s valid records, `[min_ms, max_ms]`."""
    old_min, old_max = checkpoint.min_event_time_ms, checkpoint.max_event_time_ms
    checkpoint.min_event_time_ms = min_ms if old_min is None else min(old_min, min_ms)
    checkpoint.max_event_time_ms = max_ms if old_max is None else max(old_max, max_ms)
    recent = [*checkpoint.recent_batches, (batch_id, min_ms)]
    checkpoint.recent_batches = recent[-SourceCheckpoint.RECENT_BATCHES :]
