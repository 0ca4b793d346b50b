"""A batch's one Spark action: its landed records read, validated and classified (`onceflow.jobs.ingest.validation`),
and brought to the driver (`BatchRead`), with the landing's own count of them read beside it.

Either every column of the batch's records comes to the driver, where its rows are decided and delta-rs writes them
(`rows_to_driver`), or the batch is cached and its valid records stay a DataFrame over it, for Spark to write or
MERGE. A read depends on nothing but the batch's plan, so the next batch's may begin while this one commits
(`onceflow.jobs.sources.read_ahead`).
"""

from __future__ import annotations

import functools
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from onceflow.jobs.declare.record_contract import RecordContract
from onceflow.jobs.declare.schema import has_variant, quoted, type_ddl
from onceflow.jobs.dedup.fingerprints import ID_HASH_COLUMNS, hashes_in_spark, id_hash_sql
from onceflow.jobs.dedup.first_records import without_ordinals
from onceflow.jobs.delta.raw_table import DEAD_LETTER_SCHEMA, bucket_of, ensure_raw_table, raw_schema
from onceflow.jobs.delta.transactions import begin_append, create_table_once, table_properties
from onceflow.jobs.ingest.dead_letters import COLUMNS as DEAD_LETTER_COLUMNS
from onceflow.jobs.ingest.validation import batch_numbers, classify_numbered
from onceflow.jobs.sources.checkpoint import BatchPlan
from onceflow.jobs.sources.reader import SourceRuntime
from onceflow.resources.plan_template import PlanTemplate

DRIVER_COLUMNS = ("reason", "unix_millis(event_time) AS t", "raw", "detail")
"""What the driver reads of every record besides its raw columns, when the rows come to it whole."""
_counter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="onceflow-landed-count")


@dataclass
class BatchRead:
    """A batch read: its driver-side columns (`slim`: `reason, record_id, ordinal, t, time_bucket` and the dead
    letters' columns), its records' raw columns (`records`: row for row with `slim` when they came to the driver,
    else a DataFrame of its valid ones over `cached`), the landing's own count of its records (`landed`), the
    contract it was classified under (its plan's: `RecordContract.planned`), and the
    raw append's transaction when begun beside the read (`begun`), and how long the read took (`seconds`)."""

    slim: pa.Table
    records: DataFrame | pa.Table
    landed: int
    contract: RecordContract
    begun: Future | None = None
    cached: DataFrame | None = None
    seconds: float = 0.0

    def valid(self, dropped: np.ndarray | None = None) -> DataFrame | pa.Table:
        """The batch's valid records' raw columns, without `ordinal`, but for those `dropped` marks (a mask over
        them, in `slim`'s order). Rows held here are filtered once, whatever is dropped: the table is wide."""
        is_valid = pc.is_null(self.slim["reason"])
        if isinstance(self.records, pa.Table):
            keep = is_valid.to_numpy(zero_copy_only=False)
            if dropped is not None:
                keep[np.flatnonzero(keep)[dropped]] = False
            return self.records.filter(pa.array(keep)).drop_columns(["ordinal"])
        ordinals = self.slim["ordinal"].filter(is_valid).to_numpy()
        return without_ordinals(self.records, ordinals[dropped] if dropped is not None else ordinals[:0])

    def release(self) -> None:
        """Let go of the batch's cache, if it has one."""
        if self.cached is not None:
            self.cached.unpersist()


def ensure_tables(source: SourceRuntime) -> None:
    ensure_raw_table(source.raw_path, source.pipeline)
    create_table_once(source.dead_letter_path, DEAD_LETTER_SCHEMA, table_properties(source.pipeline.retention_s))


def raw_columns(source: SourceRuntime, contract: RecordContract) -> tuple[str, ...]:
    """SQL: the raw table's columns of a record classified under `contract`; a field the declaration added since
    the batch was planned (the plan's contract lacks it) is NULL, as in the rows committed before it."""
    planned = {f.name for f in contract.schema}
    fields = [quoted(f.name) if f.name in planned else f"CAST(NULL AS {type_ddl(f.dataType)}) AS {quoted(f.name)}"
              for f in source.pipeline.record_schema]
    return (
        "record_id", "event_time", *fields, "payload", "source_position",
        "publish_time", "batch_id", "timestamp_millis(_ingested_ms) AS ingested_at", "time_bucket",
        *(quoted(f.name) for f in source.pipeline.source.bookkeeping), "ordinal",
    )


def read_batch(spark: SparkSession, source: SourceRuntime, plan: BatchPlan, landed: DataFrame) -> BatchRead:
    """Read, validate and classify batch `plan`'s `landed` records in one Spark action (see the module docstring);
    the tables are made first if they are not yet. Raises what the landing's count found wrong (a file changed
    since it was planned) before anything else."""
    start = time.perf_counter()
    # The landing's own count (an independent fact) is read beside the batch's Spark job.
    counted = _counter.submit(source.reader.landed_count, plan)
    rows_here = rows_to_driver(source)
    # Made (on a first batch) and the append's transaction begun beside the batch's first Spark job.
    begun = None if rows_here else begin_append(spark, source.raw_path, lambda: ensure_tables(source))
    if begun is None:
        ensure_tables(source)
    contract = RecordContract.planned(source.pipeline, plan.contract, f"{source.app_id} batch {plan.batch_id}")
    numbers = batch_numbers(contract, plan.planned_at_ms, plan.horizon_floor_ms, batch_id=plan.batch_id,
                            _ingested_ms=plan.planned_at_ms)
    columns = raw_columns(source, contract)
    # Rows to the driver: the plan ends with the one projection the driver reads, so it is part of the template.
    # The ID filters' fingerprints of the records are computed there too, where the session can (`IdHash.java`).
    hashed = rows_here and source.id_filters is not None and hashes_in_spark(spark)
    outputs = (*DRIVER_COLUMNS, *(id_hash_sql() if hashed else ()), *columns) if rows_here else ()
    classified = _classified(spark, landed, contract, source.pipeline.time_bucket_ms, numbers, outputs)
    cached = None if rows_here else classified.cache()
    try:
        slim, records = _read(classified if cached is None else cached, columns, rows_here, counted)
        if begun is not None:
            begun.result()  # the tables exist from here on
        # Before anything commits: a landing that cannot be counted stops the batch.
        return BatchRead(slim, records, counted.result(), contract, begun, cached, time.perf_counter() - start)
    except BaseException:
        if cached is not None:
            cached.unpersist()
        raise


def _classified(
    spark: SparkSession, landed: DataFrame, contract: RecordContract, bucket_ms: int, numbers: dict[str, int],
    outputs: tuple[str, ...],
) -> DataFrame:
    """The batch's records classified (`classify`) with their time bucket, projected to `outputs` (SQL) unless it
    is empty: on a classic session, by the plan analysed once for the pipeline (`PlanTemplate`)."""
    if not hasattr(spark, "_jsparkSession"):
        return _bucketed(landed, numbers, contract=contract, bucket_ms=bucket_ms, outputs=outputs)
    settings = PlanTemplate.settings(spark)
    template = _template(spark, contract, bucket_ms, outputs, landed.schema, tuple(numbers), settings)
    return template(landed, numbers)


@functools.lru_cache(maxsize=16)
def _template(
    spark: SparkSession, contract: RecordContract, bucket_ms: int, outputs: tuple[str, ...],
    schema: T.StructType, names: tuple[str, ...], settings: str,
) -> PlanTemplate:
    """`_classified`'s plan for a pipeline, analysed once in `spark` under its `settings` (a digest of them)."""
    build = functools.partial(_bucketed, contract=contract, bucket_ms=bucket_ms, outputs=outputs)
    return PlanTemplate(spark, schema, build, dict.fromkeys(names, 0))


def _bucketed(
    landed: DataFrame, numbers: dict[str, int], *, contract: RecordContract, bucket_ms: int, outputs: tuple[str, ...],
) -> DataFrame:
    checked = classify_numbered(landed, contract, numbers)
    # Projections are SQL text: each column built in Python costs round trips to the JVM.
    bucketed = checked.selectExpr(*(quoted(name) for name in checked.columns if name != "attributes"),
                                  f"{bucket_of('event_time', bucket_ms)} AS time_bucket")
    return bucketed.selectExpr(*outputs) if outputs else bucketed


def _read(
    classified: DataFrame, columns: tuple[str, ...], rows_here: bool, counted: Future
) -> tuple[pa.Table, DataFrame | pa.Table]:
    """The batch's one Spark action (`read_batch`): its driver-side columns, and its records' raw `columns`: all of
    them here (`rows_here`), or its valid ones' as a DataFrame over the cached batch."""
    try:
        if rows_here:  # `classified` is projected to `DRIVER_COLUMNS` and `columns` already
            slim = classified.toArrow()
            driver_only = ["reason", "t", "raw", "detail", *(c for c in ID_HASH_COLUMNS if c in slim.column_names)]
            # Not filtered here: the valid records are copied once, when what the batch drops is known (`valid`).
            return slim, slim.drop_columns(driver_only)
        slim = classified.selectExpr(
            "reason", "record_id", "ordinal", "unix_millis(event_time) AS t", "time_bucket", *DEAD_LETTER_COLUMNS
        ).toArrow()
        return slim, classified.filter("reason IS NULL").selectExpr(*columns)
    except Exception:
        counted.result()  # a landing that changed under Spark's read (checked beside it) is the error to report
        raise


def rows_to_driver(source: SourceRuntime) -> bool:
    """Whether a batch's rows come to the driver whole, to be decided there and written by delta-rs: unless the raw
    table holds VARIANT (delta-rs cannot write it) or its dedup is the MERGE (no ID filters), which are Spark's.

    A batch is then one Spark job, with nothing cached: its second job (Delta's writer, over the cache) cost more
    than the rows' trip to the driver. Every source bounds a batch's size (`max_bytes`, `max_messages`,
    `max_records`; `onceflow.orchestration.pipelines` sets them where a declaration does not), and so what the
    driver holds."""
    if source.pipeline.delivery == "exactly_once" and source.id_filters is None:
        return False
    return not has_variant(raw_schema(source.pipeline))
