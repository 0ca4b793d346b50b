"""One batch's commit to one table as the idempotent transaction `(app id, batch)`, and what that commit did.

A batch found committed before this attempt wrote anything is a replay; one committed by another attempt while
this one was writing is a lost race. Either way nothing is written now, and the figures reported are those of the
commit that did the work, read back from the table's history: only the attempt whose commit holds the batch ever
reports rows as its own.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession

from onceflow.jobs.dedup.filter_store import IdFilterStore
from onceflow.jobs.dedup.fingerprints import Fingerprints
from onceflow.jobs.dedup.id_filters import IdFilters
from onceflow.jobs.delta.commit_log import committed_metrics, holds_batch, own_commit_version, rows_appended
from onceflow.jobs.delta.transactions import append_once, delta_transaction, is_concurrent_commit
from onceflow.jobs.ingest.stage_times import StageTimes
from onceflow.jobs.sources.checkpoint import BatchPlan
from onceflow.jobs.sources.reader import SourceRuntime

MERGE_TRIES = 3


@dataclass(frozen=True)
class Written:
    inserted: int
    replayed: bool
    lost_race: bool = False


def merge_once(
    spark: SparkSession, source: SourceRuntime, plan: BatchPlan, rows: DataFrame, path: str, lookup: str,
    metadata: dict,
) -> Written:
    """Insert the rows whose IDs the table does not hold yet, as the transaction `(app id, batch)`; `lookup` is
    SQL appended to the match condition that bounds which target rows are read (`t.` is the table)."""
    view = f"onceflow_batch_{uuid.uuid4().hex}"
    rows.createOrReplaceTempView(view)

    def merge() -> int | None:
        with delta_transaction(spark, source.app_id, plan.batch_id, metadata):
            answer = spark.sql(
                f"MERGE INTO delta.`{path}` t USING {view} s ON t.record_id = s.record_id{lookup} "
                "WHEN NOT MATCHED THEN INSERT *"
            ).collect()
        # Delta skips a MERGE whose SetTransaction it has seen: no result row, no commit.
        return int(answer[0]["num_inserted_rows"]) if answer else None

    try:
        return commit_once(spark, source, plan, path, metadata, merge)
    finally:
        spark.catalog.dropTempView(view)


def append_new(
    spark: SparkSession, source: SourceRuntime, plan: BatchPlan, rows: DataFrame | pa.Table, count: int, metadata: dict,
    begun: Future | None,
) -> Written:
    """Append `count` rows no dedup applies to (at-least-once), as the transaction `(app id, batch)`."""
    transactions = iter([begun])  # the one begun ahead serves the first attempt; a retry starts afresh

    def append() -> int | None:
        written = append_once(rows, source.raw_path, source.app_id, plan.batch_id, metadata, next(transactions, None))
        return count if written else None

    return commit_once(spark, source, plan, source.raw_path, metadata, append)


def commit_on_filters(
    spark: SparkSession, source: SourceRuntime, plan: BatchPlan, path: str, metadata: dict,
    filters_of: tuple[IdFilterStore, int | None], ids: tuple[Fingerprints, np.ndarray],
    write: Callable[[IdFilters, np.ndarray], int | None], times: StageTimes | None = None,
) -> Written:
    """`commit_once` for a batch decided against a table's ID filters (`filters_of`: their store, and the lowest
    bucket a lookup needs): on each try, the filters caught up with the table's latest commit say which of the
    batch's IDs (`ids`: their fingerprints and buckets) it holds, and `write(filters, seen)` appends the rest on
    `filters.version`, so that any commit since fails the append and the batch is decided again. Once committed,
    the new IDs join the filters beside what the process does next (`IdFilterStore.release_later`). The lookups
    count as the `dedup` stage of `times`, if given."""
    store, floor = filters_of
    # Sorted by first half once, here: the search and the filters' runs each sort what they are given, which
    # costs next to nothing once it is sorted.
    order = np.argsort(ids[0].first)
    prints, buckets = ids[0].take(order), ids[1][order]
    held: list[tuple[IdFilters, np.ndarray]] = []  # the last try's filters, and which IDs they held (sorted)

    def attempt() -> int | None:
        while held:  # a retry: the last try's filters go back, to be caught up with the commit that beat it
            store.release(held.pop()[0])
        with times.stage("dedup") if times is not None else contextlib.nullcontext():
            filters = store.load(floor)
            found = filters.seen(prints)
        held.append((filters, found))
        seen = np.empty_like(found)
        seen[order] = found
        return write(filters, seen)

    written = commit_once(spark, source, plan, path, metadata, attempt)
    if held:
        filters, found = held.pop()
        new = None if written.replayed else (prints.take(~found), buckets[~found])

        def upkeep(filters: IdFilters) -> None:
            if new is not None:
                filters.add(*new)
                filters.version = own_commit_version(path, metadata, after=filters.version)
            filters.drop_below(floor)

        store.release_later(filters, upkeep)  # off the batch's path: only the next batch's lookup needs them
    return written


def commit_once(
    spark: SparkSession, source: SourceRuntime, plan: BatchPlan, path: str, metadata: dict,
    write: Callable[[], int | None],
) -> Written:
    """Run `write` (rows inserted, or None when Delta skipped the batch as committed), retrying lost races with
    other writers; `write` decides afresh on each try. A table holding a later batch of the app id than this one
    is a `LakeAheadError`, never a replay."""
    if holds_batch(path, source.app_id, plan.batch_id):
        return _done_before(spark, path, metadata, lost_race=False)
    for attempt in range(MERGE_TRIES):
        try:
            inserted = write()
            break
        except Exception as error:
            if not is_concurrent_commit(error):
                raise
            if holds_batch(path, source.app_id, plan.batch_id):
                return _done_before(spark, path, metadata, lost_race=True)  # a concurrent attempt at this batch
            if attempt == MERGE_TRIES - 1:
                raise  # other writers kept committing first: fail, Dagster retries the run
    if inserted is not None:
        return Written(inserted, replayed=False)
    if not holds_batch(path, source.app_id, plan.batch_id):
        raise RuntimeError(f"{path}: batch {plan.batch_id} of {source.app_id} was neither written nor committed")
    # Not committed when this attempt began, committed by another before this one could: it lost the race.
    return _done_before(spark, path, metadata, lost_race=True)


def _done_before(spark: SparkSession, path: str, metadata: dict, lost_race: bool) -> Written:
    """The batch as the commit that holds it did it: nothing written by this attempt."""
    metrics = committed_metrics(spark, path, metadata)
    inserted = int(metrics["numTargetRowsInserted"]) if "numTargetRowsInserted" in metrics else rows_appended(metrics)
    return Written(inserted, replayed=True, lost_race=lost_race)
