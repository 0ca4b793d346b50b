"""Ingest: exactly-once from a landed batch into the raw Delta table, which is the dedup catalog.

Per batch: validate every record against the pipeline's record contract (`onceflow.jobs.ingest.validation`; bad ones become
dead-letter rows with a reason) in one Spark action (`onceflow.jobs.ingest.batch_read`), and drop duplicates inside
the batch (decided on the driver from a few of its columns). That action brings the batch's rows to the driver
whole, for delta-rs to write them, or else caches the batch for Spark to write or MERGE its rows. Then, with the ID filters
(`onceflow.jobs.dedup.id_filters`, the fast path), look up only the IDs they cannot rule out and append the rest
(`onceflow.jobs.delta.transactions.append_once`); without them,
`MERGE INTO raw ... ON record_id ... WHEN NOT MATCHED THEN INSERT` with a partition predicate that bounds the
lookup to the dedup horizon. Dead letters are appended to the dead-letter table unless it holds their record ID
(`onceflow.jobs.ingest.dead_letters`), so a bad record redelivered in a later batch is held once. Every commit
carries the SetTransaction `(app id, batch id)`, so replaying a committed batch changes nothing; a concurrent
attempt at the same batch that commits first makes this one a replay.

What a batch did is counted from independent facts where there are some: `landed` comes from the landing
(Parquet metadata, the planned files' lines, or the planned Kafka offsets, read again where Spark saw another
number of records), `inserted` and `dead_lettered_new` from the Delta commits' own metrics; `balances()` checks
them against the classification.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from concurrent.futures import Future

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import SparkSession

from onceflow.jobs.dedup.filter_store import IdFilterStore
from onceflow.jobs.dedup.fingerprints import ID_HASH_COLUMNS, Fingerprints
from onceflow.jobs.dedup.first_records import first_ids, first_prints
from onceflow.jobs.dedup.id_filters import IdFilters
from onceflow.jobs.delta.commit_log import ATTEMPT_KEY
from onceflow.jobs.delta.transactions import append_once, latest_version
from onceflow.jobs.ingest.batch_commit import Written, append_new, commit_on_filters, merge_once
from onceflow.jobs.ingest.batch_read import BatchRead
from onceflow.jobs.ingest.dead_letters import commit_beside
from onceflow.jobs.ingest.result import IngestResult
from onceflow.jobs.sources.checkpoint import BatchPlan
from onceflow.jobs.sources.committed_plans import PLAN_KEY
from onceflow.jobs.sources.landing import STREAM_STRIDE
from onceflow.jobs.sources.reader import SourceRuntime

EVENT_TIMES_KEY = "onceflow_event_times"
RECEIVED_KEY = "onceflow_received"


class BatchDoesNotBalance(RuntimeError):
    """A batch's counts do not add up: its landing's count of records differs from what was read of it."""


def ingest_batch(
    spark: SparkSession, source: SourceRuntime, plan: BatchPlan, read: BatchRead,
    on_read: Callable[[IngestResult, Future | None], None] | None = None,
) -> IngestResult:
    """Commit one batch, `read` (`onceflow.jobs.ingest.batch_read.read_batch`), to the raw and dead-letter tables,
    exactly once (or at least once). `on_read(result, dead_letters)`, once its counts and event times are known and
    its dead letters' commit (a future, None without dead letters) is begun, may begin work beside its commit."""
    pipeline, slim, begun = source.pipeline, read.slim, read.begun
    result = IngestResult(batch_id=plan.batch_id, landed=read.landed)
    # The plan travels in the commit: a checkpoint restored from an old copy loses plans, the lake keeps them.
    # The attempt's id tells which of two concurrent attempts at the batch made the commit that holds it.
    metadata = {"onceflow_source": source.app_id, "onceflow_batch": plan.batch_id, PLAN_KEY: plan.to_dict(),
                ATTEMPT_KEY: uuid.uuid4().hex}
    contract = read.contract
    pending: Future | None = None
    try:
        _summarize(slim, result)
        if result.landed != result.received:  # planned positions that hold no record, or a reading that lost some
            result.landed = source.reader.recount(plan, result.landed)
        if result.landed != result.received:  # checked before anything commits: a batch that cannot balance
            raise BatchDoesNotBalance(f"{source.app_id} batch {plan.batch_id}: its landing holds {result.landed} "
                                      f"records, Spark's reading of it {result.received}; nothing committed")
        # What the batch landed, kept for `verify` once the source lets its input go.
        source.manifests.write(plan.batch_id, slim)
        if any(output.late_policy == "refire" for output in pipeline.windowed_outputs):  # for the window sensor's refires
            source.manifests.write_minutes(plan.batch_id, slim)
        if result.min_event_time_ms is not None:  # and its event times, for the watermark and the windows
            metadata[EVENT_TIMES_KEY] = [result.min_event_time_ms, result.max_event_time_ms]
        metadata[RECEIVED_KEY] = result.received  # for a checkpoint that learns the batch from the lake
        # Dead letters commit first, raw last: a batch is committed once raw holds it (`micro_batch.lake_batch`).
        # They are explained and committed on a thread of their own while the valid records are decided.
        dead = slim.filter(pc.is_valid(slim["reason"]))
        pending, dead_letters_first = commit_beside(spark, source, plan, contract, dead, metadata, result)
        if on_read is not None:
            on_read(result, pending)
        valid_count = result.received - dead.num_rows
        if pipeline.delivery == "at_least_once":
            rows = read.valid()
            dead_letters_first()
            with result.times.stage("write"):
                written = append_new(spark, source, plan, rows, valid_count, metadata, begun)
            result.raw_version = latest_version(source.raw_path)
            result.replayed, result.lost_race, result.inserted = written.replayed, written.lost_race, written.inserted
            return result
        # The few columns the dedup reads are filtered, not the rows' payloads: the fingerprints stand for the IDs.
        hashed = [c for c in ID_HASH_COLUMNS if c in slim.column_names]
        valid = slim.select(["time_bucket", "ordinal", *(hashed or ["record_id"])]).filter(pc.is_null(slim["reason"]))
        if source.id_filters is None:
            with result.times.stage("dedup"):
                firsts, kept = first_ids(valid)
            unique_count = firsts.num_rows
            unique = read.valid(~kept)
            horizon = _horizon(plan.horizon_floor_ms, pipeline.time_bucket_ms)
            dead_letters_first()
            with result.times.stage("merge"):
                written = merge_once(spark, source, plan, unique, source.raw_path, horizon, metadata)
        else:
            with result.times.stage("dedup"):
                prints, at = first_prints(valid)
            unique_count = len(at)
            firsts = (prints, valid["time_bucket"].to_numpy()[at], at, valid.num_rows)
            written = _merge_with_filters(spark, source, source.id_filters, plan, read, firsts, metadata, result,
                                          (begun, dead_letters_first))
            dead_letters_first()  # a replay appends nothing, so it did not wait for them
        result.duplicates_in_batch = valid_count - unique_count
        result.raw_version = latest_version(source.raw_path)
        result.replayed, result.lost_race = written.replayed, result.lost_race or written.lost_race
        result.inserted = written.inserted
        result.duplicates_committed = unique_count - written.inserted
        return result
    finally:
        if pending is not None:
            pending.exception()  # nothing of a batch outlives it, the error raised already when there was one
        read.release()


def _horizon(horizon_floor_ms: int | None, bucket_ms: int) -> str:
    # A constant predicate on the partition column: the MERGE reads only buckets inside the dedup horizon.
    return "" if horizon_floor_ms is None else f" AND t.time_bucket >= {horizon_floor_ms // bucket_ms}"


def _merge_with_filters(
    spark: SparkSession, source: SourceRuntime, store: IdFilterStore, plan: BatchPlan, read: BatchRead,
    firsts: tuple[Fingerprints, np.ndarray, np.ndarray, int], metadata: dict, result: IngestResult,
    before: tuple[Future | None, Callable[[], None]],
) -> Written:
    """Commit the first record of each ID of a batch's valid records (`firsts`: their fingerprints, buckets and
    positions among the batch's valid records, and how many those are) unless the table holds its ID, as the ID
    filters say; then the batch's IDs join the filters. `before`: the append's transaction if begun, and what must
    be done before the raw commit (the batch's dead letters committed).

    The append is made on the very table version the filters answered for, and any commit since, whatever its app
    id, makes it fail: then it is decided again against the filters caught up with that commit, and retried.
    """
    prints, buckets, at, valid_count = firsts
    floor = None if plan.horizon_floor_ms is None else plan.horizon_floor_ms // source.pipeline.time_bucket_ms
    begun, dead_letters_first = before
    transactions = iter([begun])  # the one begun ahead serves the first attempt; a retry starts afresh

    def append(filters: IdFilters, seen: np.ndarray) -> int | None:
        _count(filters, seen, result)
        dropped = np.ones(valid_count, dtype=bool)
        dropped[at[~seen]] = False  # one filter drops the batch's repeats and the IDs the table holds
        rows = read.valid(dropped)
        dead_letters_first()
        with result.times.stage("write"):
            written = append_once(rows, source.raw_path, source.app_id, plan.batch_id, metadata,
                                  next(transactions, None), read_version=filters.version)
        return len(at) - int(seen.sum()) if written else None

    return commit_on_filters(spark, source, plan, source.raw_path, metadata, (store, floor), (prints, buckets), append,
                             result.times)


def _count(filters: IdFilters, seen: np.ndarray, result: IngestResult) -> None:
    """The fast path's figures for the batch: how many of its first IDs the table held at the filters' version."""
    result.fast_path = {"proven_new": int(len(seen) - seen.sum()), "committed_found": int(seen.sum()),
                        "filters_rebuilt": filters.rebuilt, "filters_caught_up_commits": filters.caught_up}


def _summarize(slim: pa.Table, result: IngestResult) -> None:
    """The batch's count and its valid records' event-time range, from its slim columns (the dead letters' counts
    per reason are `commit_explained`'s)."""
    result.received = slim.num_rows
    valid = slim.select(["t", "ordinal"]).filter(pc.is_null(slim["reason"]))
    times = valid["t"]
    if len(times):
        result.min_event_time_ms, result.max_event_time_ms = pc.min(times).as_py(), pc.max(times).as_py()
        streams = pa.table({"stream": pc.divide(valid["ordinal"], STREAM_STRIDE), "t": times})
        result.stream_max_event_ms = {row["stream"]: row["t_max"] for row in
                                      streams.group_by("stream").aggregate([("t", "max")]).to_pylist()}
