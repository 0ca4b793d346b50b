"""Ingest: exactly-once from a landed batch into the raw Delta table, which is the dedup catalog.

Per batch: validate every record against the pipeline's record contract (`jobs.validation`; bad ones become
dead-letter rows with a reason), drop duplicates inside the batch, then `MERGE INTO raw ... ON record_id ...
WHEN NOT MATCHED THEN INSERT` with a partition predicate that bounds the lookup to the dedup horizon. The MERGE and the dead-letter append each carry the
SetTransaction `(source_id, batch_id)`, so replaying a committed batch changes nothing.

Received records always balance: received = inserted + duplicates (in batch, already committed, or in a replayed
batch) + dead-lettered.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from jobs.declaration import Pipeline
from jobs.delta_txn import append_once, committed_metrics, delta_transaction, latest_version
from jobs.schema import field_ddl
from jobs.validation import RecordContract, classify
from resources.checkpoint import BatchPlan

DEAD_LETTER_COLUMNS = """
    source_position STRING, raw STRING, reason STRING NOT NULL, detail STRING, record_id STRING,
    event_time TIMESTAMP, batch_id BIGINT, ingested_at TIMESTAMP
"""
# The raw table's time bucket (its partition column): the unit in which the dedup horizon prunes the MERGE.
BUCKET_FORMAT = "yyyy-MM-dd-HH"


def raw_columns(schema: T.StructType) -> str:
    """The raw table's columns: `record_id`, `event_time`, the schema's fields, then onceflow's bookkeeping."""
    fields = ", ".join(field_ddl(f) for f in schema)
    return (
        f"record_id STRING NOT NULL, event_time TIMESTAMP NOT NULL, {fields}, payload STRING, "
        "source_position STRING, publish_time TIMESTAMP, batch_id BIGINT, ingested_at TIMESTAMP, "
        "time_bucket STRING NOT NULL"
    )


@dataclass
class IngestResult:
    """What one micro-batch did; the counts balance: received = inserted + duplicates + dead_lettered.

    For a replayed batch (`replayed`: committed by an earlier attempt, so nothing was written now) the counts are
    those of the commit that did the work, read back from the Delta history: totals over batches stay exact.
    """

    batch_id: int
    received: int = 0
    inserted: int = 0
    duplicates_in_batch: int = 0
    duplicates_committed: int = 0
    dead_lettered: dict[str, int] = field(default_factory=dict)
    replayed: bool = False
    raw_version: int | None = None
    min_event_time_ms: int | None = None
    max_event_time_ms: int | None = None

    @property
    def duplicates(self) -> int:
        return self.duplicates_in_batch + self.duplicates_committed

    @property
    def dead_lettered_total(self) -> int:
        return sum(self.dead_lettered.values())

    def balances(self) -> bool:
        return self.received == self.inserted + self.duplicates + self.dead_lettered_total


def ensure_raw_table(spark: SparkSession, raw_path: str, schema: T.StructType) -> None:
    spark.sql(
        f"CREATE TABLE IF NOT EXISTS delta.`{raw_path}` ({raw_columns(schema)}) USING delta "
        "PARTITIONED BY (time_bucket)"
    )


def ensure_tables(spark: SparkSession, pipeline: Pipeline, raw_path: str, dead_letter_path: str) -> None:
    ensure_raw_table(spark, raw_path, pipeline.record_schema)
    spark.sql(f"CREATE TABLE IF NOT EXISTS delta.`{dead_letter_path}` ({DEAD_LETTER_COLUMNS}) USING delta")


def ingest_batch(
    spark: SparkSession,
    pipeline: Pipeline,
    plan: BatchPlan,
    landed: DataFrame,
    raw_path: str,
    dead_letter_path: str,
) -> IngestResult:
    """Commit one landed batch to the raw and dead-letter tables, exactly once (or at least once)."""
    ensure_tables(spark, pipeline, raw_path, dead_letter_path)
    result = IngestResult(batch_id=plan.batch_id)
    ingested_at = F.expr(f"timestamp_millis({plan.planned_at_ms})")
    metadata = {"onceflow_source": pipeline.source_id, "onceflow_batch": plan.batch_id}
    contract = RecordContract.of(pipeline)
    classified = (
        classify(landed, contract, plan.planned_at_ms, plan.horizon_floor_ms)
        .withColumn("batch_id", F.lit(plan.batch_id).cast("bigint"))
        .cache()
    )
    try:
        summary = classified.groupBy("reason").agg(
            F.count(F.lit(1)).alias("n"),
            F.min(F.when(F.col("reason").isNull(), F.col("event_time"))).alias("min_t"),
            F.max(F.when(F.col("reason").isNull(), F.col("event_time"))).alias("max_t"),
        )
        for row in summary.collect():
            result.received += row["n"]
            if row["reason"] is not None:
                result.dead_lettered[row["reason"]] = row["n"]
            elif row["n"]:
                result.min_event_time_ms = int(row["min_t"].timestamp() * 1000)
                result.max_event_time_ms = int(row["max_t"].timestamp() * 1000)
        if result.dead_lettered:
            dead = classified.filter(F.col("reason").isNotNull()).select(
                "source_position",
                F.coalesce(F.col("payload"), F.base64("data")).alias("raw"),
                "reason",
                "detail",
                "record_id",
                "event_time",
                "batch_id",
                ingested_at.alias("ingested_at"),
            )
            append_once(dead, dead_letter_path, pipeline.source_id, plan.batch_id, metadata)

        valid = classified.filter(F.col("reason").isNull()).select(
            "record_id",
            "event_time",
            *(f.name for f in contract.schema),
            "payload",
            "source_position",
            "publish_time",
            "batch_id",
            ingested_at.alias("ingested_at"),
            F.date_format("event_time", BUCKET_FORMAT).alias("time_bucket"),
            "ordinal",
        )
        valid_count = result.received - result.dead_lettered_total
        if pipeline.delivery == "at_least_once":
            before = latest_version(spark, raw_path)
            append_once(valid.drop("ordinal"), raw_path, pipeline.source_id, plan.batch_id, metadata)
            result.raw_version = latest_version(spark, raw_path)
            result.replayed = result.raw_version == before
            result.inserted = valid_count
            return result

        first = Window.partitionBy("record_id").orderBy("ordinal")
        unique = valid.withColumn("_rank", F.row_number().over(first)).filter("_rank = 1").drop("_rank", "ordinal")
        unique_count = unique.count()
        result.duplicates_in_batch = valid_count - unique_count
        inserted = _merge_new_records(spark, pipeline, plan, unique, raw_path, metadata)
        result.raw_version = latest_version(spark, raw_path)
        if inserted is None:
            result.replayed = True
            inserted = int(committed_metrics(spark, raw_path, metadata)["numTargetRowsInserted"])
        result.inserted = inserted
        result.duplicates_committed = unique_count - inserted
        return result
    finally:
        classified.unpersist()


def _merge_new_records(
    spark: SparkSession, pipeline: Pipeline, plan: BatchPlan, unique: DataFrame, raw_path: str, metadata: dict
) -> int | None:
    """Insert the records whose IDs the raw table does not hold yet; None if the batch was committed before."""
    view = f"onceflow_batch_{uuid.uuid4().hex}"
    unique.createOrReplaceTempView(view)
    horizon = ""
    if plan.horizon_floor_ms is not None:
        # A constant predicate on the partition column: the MERGE reads only buckets inside the dedup horizon.
        horizon = (
            f" AND t.time_bucket >= date_format(timestamp_millis({plan.horizon_floor_ms}), '{BUCKET_FORMAT}')"
        )
    try:
        with delta_transaction(spark, pipeline.source_id, plan.batch_id, metadata):
            rows = spark.sql(
                f"MERGE INTO delta.`{raw_path}` t USING {view} s "
                f"ON t.record_id = s.record_id{horizon} "
                "WHEN NOT MATCHED THEN INSERT *"
            ).collect()
    finally:
        spark.catalog.dropTempView(view)
    # Delta answers a MERGE it skipped for an already-seen SetTransaction with no result row and no commit.
    return int(rows[0]["num_inserted_rows"]) if rows else None
