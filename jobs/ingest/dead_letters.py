"""A batch's dead letters into the dead-letter table: each record ID held once, as the transaction `(app id, batch)`.

The batch's one Spark action brings its dead letters to the driver whole (they are few; the valid records' columns
there are a few narrow ones), so what to keep is decided there: the first record of each ID, unless the table holds
the ID already (a bad record redelivered in a later batch). Which IDs it holds, the table's ID filters say
(`onceflow.jobs.dedup.id_filters`, bucketed by batch: the table has no time buckets), as they do for the raw table:
a lookup whose cost does not grow with the table. Without them (the lake's fast path off), its `record_id` column
is read. delta-rs appends them on the table version that lookup answered for, and any commit since fails the
append, which is then decided again: the outcome of an insert-only MERGE on the record ID, without the MERGE's
Spark jobs and its scan of the whole table on every batch.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from onceflow.jobs.declare.record_contract import RecordContract
from onceflow.jobs.dedup.buckets import BATCH_RANGES
from onceflow.jobs.dedup.filter_store import IdFilterStore
from onceflow.jobs.dedup.fingerprints import id_hashes
from onceflow.jobs.dedup.first_records import first_ids
from onceflow.jobs.dedup.id_filters import IdFilters
from onceflow.jobs.delta.arrow_append import append_arrow_once
from onceflow.jobs.ingest.batch_commit import Written, commit_on_filters, commit_once
from onceflow.jobs.ingest.result import IngestResult
from onceflow.jobs.ingest.validation import explain_flagged
from onceflow.jobs.sources.checkpoint import BatchPlan
from onceflow.jobs.sources.reader import SourceRuntime
from onceflow.resources.delta_storage import delta_table, writable_table
from onceflow.resources.faults import fault_point

COLUMNS = ("CASE WHEN reason IS NOT NULL THEN source_position END AS source_position", "raw", "detail",
           "CASE WHEN reason IS NOT NULL THEN event_time END AS event_time")
"""What the batch's driver-side columns (`reason, record_id, ordinal, t, time_bucket`) add for its dead letters:
NULL for every valid record."""
_committer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="onceflow-dead-letters")


def commit_beside(
    spark: SparkSession, source: SourceRuntime, plan: BatchPlan, contract: RecordContract, dead: pa.Table,
    metadata: dict, result: IngestResult,
) -> tuple[Future | None, Callable[[], None]]:
    """Start `commit_explained` of the batch's dead letters (`dead`) on a thread of their own, when it has some, so
    they are explained and committed while its valid records are decided; and what waits for them, before the raw
    commit (dead letters commit first: a batch is committed once raw holds it). Waiting raises what failed; it
    waits once, later calls return at once."""
    def explained() -> None:
        with result.times.stage("dead_letters"):
            commit_explained(spark, source, plan, contract, dead, metadata, result)

    pending = _committer.submit(explained) if dead.num_rows else None

    def committed() -> None:
        if pending is not None:
            pending.result()
        fault_point("ingest.after_dead_letters")
        fault_point("ingest.before_raw_commit")

    return pending, functools.cache(committed)


def commit_explained(
    spark: SparkSession, source: SourceRuntime, plan: BatchPlan, contract: RecordContract, dead: pa.Table,
    metadata: dict, result: IngestResult,
) -> None:
    """The batch's dead letters (`dead`: the rows of its driver-side columns whose `reason` is set) explained
    (`explain_flagged`), counted per reason into `result`, and committed."""
    dead = explain_flagged(spark, contract, dead)
    for entry in pc.value_counts(dead["reason"]).to_pylist():
        result.dead_lettered[entry["values"]] = entry["counts"]
    result.dead_lettered_new = commit_dead_letters(spark, source, plan, dead, metadata).inserted


def commit_dead_letters(
    spark: SparkSession, source: SourceRuntime, plan: BatchPlan, dead: pa.Table, metadata: dict
) -> Written:
    """Append the batch's dead letters (`dead`: the rows of its driver-side columns whose `reason` is set) whose IDs
    the table does not hold, the first of each ID."""
    firsts, _ = first_ids(dead.select(["record_id", "ordinal"]))
    dead = dead.filter(pc.is_in(dead["ordinal"], value_set=firsts["ordinal"]))
    size = dead.num_rows
    rows = pa.table({
        "source_position": dead["source_position"], "raw": dead["raw"], "reason": dead["reason"],
        "detail": dead["detail"], "record_id": dead["record_id"],
        "event_time": dead["event_time"],
        "batch_id": pa.array([plan.batch_id] * size, pa.int64()),
        "ingested_at": pa.array([plan.planned_at_ms * 1000] * size, pa.timestamp("us", tz="UTC")),
    })
    path, store = source.dead_letter_path, source.dead_letter_filters
    if store is None:
        def append() -> int | None:
            table = delta_table(path)
            new = rows.filter(pc.invert(pc.is_in(rows["record_id"], value_set=held_among(table, rows["record_id"]))))
            return new.num_rows if append_arrow_once(table, new, source.app_id, plan.batch_id, metadata) else None

        return commit_once(spark, source, plan, path, metadata, append)
    return _commit_with_filters(spark, source, plan, rows, metadata, store)


def _commit_with_filters(
    spark: SparkSession, source: SourceRuntime, plan: BatchPlan, rows: pa.Table, metadata: dict,
    store: IdFilterStore,
) -> Written:
    """Append those of `rows` whose IDs the dead-letter table's filters do not hold (`commit_on_filters`); their
    bucket is the batch's (`BATCH_RANGES`)."""
    path, prints = source.dead_letter_path, id_hashes(rows["record_id"])

    def append(filters: IdFilters, seen: np.ndarray) -> int | None:
        new = rows.filter(pa.array(~seen))
        table = writable_table(path, filters.version)
        return new.num_rows if append_arrow_once(table, new, source.app_id, plan.batch_id, metadata) else None

    ids = (prints, BATCH_RANGES.of_batch(plan.batch_id, len(prints)))
    return commit_on_filters(spark, source, plan, path, metadata, (store, None), ids, append)


def held_among(table: DeltaTable, ids: pa.ChunkedArray | pa.Array) -> pa.Array:
    """Which of `ids` `table` holds: its record IDs read straight from its files (delta-rs and pyarrow, no Spark),
    one column, keeping only those among `ids`."""
    wanted = ids.cast(pa.string()).unique().to_pylist()
    found = table.to_pyarrow_table(columns=["record_id"], filters=[("record_id", "in", wanted)])
    return found["record_id"].combine_chunks()
