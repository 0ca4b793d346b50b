"""Ingest: exactly-once from a landed batch into the raw Delta table, which is the dedup catalog.

Per batch: parse and validate every record (bad ones become dead-letter rows with a reason), drop duplicates
inside the batch, then `MERGE INTO raw ... ON record_id ... WHEN NOT MATCHED THEN INSERT` with a partition
predicate that bounds the lookup to the dedup horizon. The MERGE and the dead-letter append each carry the
SetTransaction `(source_id, batch_id)`, so replaying a committed batch changes nothing.

Received records always balance: received = inserted + duplicates (in batch, already committed, or in a replayed
batch) + dead-lettered.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from jobs.delta_txn import append_once, committed_metrics, delta_transaction, latest_version
from jobs.pipeline import FileSourceSpec, Pipeline
from resources.checkpoint import BatchPlan

RAW_COLUMNS = """
    record_id STRING NOT NULL, event_time TIMESTAMP NOT NULL, key STRING NOT NULL, value DECIMAL(38, 9) NOT NULL,
    payload STRING, source_position STRING, publish_time TIMESTAMP, batch_id BIGINT, ingested_at TIMESTAMP,
    time_bucket STRING NOT NULL
"""
DEAD_LETTER_COLUMNS = """
    source_position STRING, raw STRING, reason STRING NOT NULL, detail STRING, record_id STRING,
    event_time TIMESTAMP, batch_id BIGINT, ingested_at TIMESTAMP
"""
# The raw table's time bucket (its partition column): the unit in which the dedup horizon prunes the MERGE.
BUCKET_FORMAT = "yyyy-MM-dd-HH"
# Values are exact decimals (BigQuery's NUMERIC): sums are then the same whatever order Spark adds them in.
VALUE_TYPE = "decimal(38, 9)"
NUMERIC_VARIANT_TYPES = ("TINYINT", "SMALLINT", "INT", "BIGINT", "FLOAT", "DOUBLE")


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


def ensure_raw_table(spark: SparkSession, raw_path: str) -> None:
    spark.sql(
        f"CREATE TABLE IF NOT EXISTS delta.`{raw_path}` ({RAW_COLUMNS}) USING delta PARTITIONED BY (time_bucket)"
    )


def ensure_tables(spark: SparkSession, raw_path: str, dead_letter_path: str) -> None:
    ensure_raw_table(spark, raw_path)
    spark.sql(f"CREATE TABLE IF NOT EXISTS delta.`{dead_letter_path}` ({DEAD_LETTER_COLUMNS}) USING delta")


def classify(pipeline: Pipeline, plan: BatchPlan, landed: DataFrame) -> DataFrame:
    """Parse and validate landed records: adds the typed columns and `reason` (NULL for a good record).

    `landed` has the landing schema (ordinal, source_position, publish_time, attributes, data). Checks run in
    order and the first failing one names the reason: `oversized`, `not_json`, `missing_key`, `wrong_type_key`,
    `missing_value`, `wrong_type_value`, `value_out_of_range`, `missing_event_time`, `bad_event_time`,
    `beyond_dedup_horizon`.
    """
    spec = pipeline.source
    df = (
        landed.withColumn("payload_bytes", F.length("data"))
        .withColumn("payload", F.expr("try_validate_utf8(cast(data AS STRING))"))
        .withColumn(
            "v",
            F.when(F.col("payload_bytes") <= pipeline.max_record_bytes, F.expr("try_parse_json(payload)")),
        )
        .withColumn("top_type", F.expr("schema_of_variant(v)"))
        .withColumn("key_type", F.expr("schema_of_variant(variant_get(v, '$.key'))"))
        .withColumn("value_type", F.expr("schema_of_variant(variant_get(v, '$.value'))"))
    )
    if isinstance(spec, FileSourceSpec):
        id_value = _json_field(spec.id_field)
        time_raw = _json_field(spec.timestamp_field)
        fallback_time = F.lit(None).cast("timestamp")
    else:
        id_value = _attribute(spec.id_attribute)
        time_raw = _attribute(spec.timestamp_attribute)
        fallback_time = F.col("publish_time")
    df = (
        df.withColumn("record_id", F.coalesce(id_value, F.col("source_position")))
        .withColumn("time_raw", time_raw)
        .withColumn(
            "event_time",
            F.when(F.col("time_raw").isNull(), fallback_time)
            .when(F.col("time_raw").rlike(r"^-?[0-9]{1,15}$"), F.expr("timestamp_millis(cast(time_raw AS BIGINT))"))
            .otherwise(F.expr("try_to_timestamp(time_raw)")),
        )
        .withColumn("key", F.expr("try_variant_get(v, '$.key', 'string')"))
        .withColumn("value", F.expr(f"try_variant_get(v, '$.value', '{VALUE_TYPE}')"))
    )
    numeric = F.col("value_type").isin(*NUMERIC_VARIANT_TYPES) | F.col("value_type").startswith("DECIMAL")
    floor = plan.horizon_floor_ms
    checks: list[tuple[Column, str, Column]] = [
        (
            F.col("payload_bytes") > pipeline.max_record_bytes,
            "oversized",
            F.format_string(f"record is %d bytes; the limit is {pipeline.max_record_bytes}", "payload_bytes"),
        ),
        (F.col("payload").isNull(), "not_json", F.lit("payload is not valid UTF-8")),
        (
            F.col("top_type").isNull() | ~F.col("top_type").startswith("OBJECT"),
            "not_json",
            F.when(F.col("top_type").isNull(), F.lit("payload is not JSON")).otherwise(
                F.format_string("payload is JSON %s, not an object", "top_type")
            ),
        ),
        (F.col("key_type").isNull() | (F.col("key_type") == "VOID"), "missing_key", F.lit("no `key` field")),
        (F.col("key_type") != "STRING", "wrong_type_key", F.format_string("`key` is %s, not a string", "key_type")),
        (F.col("value_type").isNull() | (F.col("value_type") == "VOID"), "missing_value", F.lit("no `value` field")),
        (~numeric, "wrong_type_value", F.format_string("`value` is %s, not a number", "value_type")),
        (F.col("value").isNull(), "value_out_of_range", F.lit(f"`value` does not fit {VALUE_TYPE}")),
        (F.col("event_time").isNull() & F.col("time_raw").isNull(), "missing_event_time", F.lit("no event time")),
        (
            F.col("event_time").isNull(),
            "bad_event_time",
            F.format_string("event time %s is neither RFC 3339 nor epoch milliseconds", "time_raw"),
        ),
    ]
    if floor is not None:
        checks.append(
            (
                F.col("event_time") < F.expr(f"timestamp_millis({floor})"),
                "beyond_dedup_horizon",
                F.format_string(
                    "event time %s is older than the dedup horizon (%s)",
                    F.col("event_time").cast("string"),
                    F.expr(f"cast(timestamp_millis({floor}) AS STRING)"),
                ),
            )
        )
    reason = F.lit(None).cast("string")
    detail = F.lit(None).cast("string")
    for condition, name, text in reversed(checks):
        reason = F.when(condition, F.lit(name)).otherwise(reason)
        detail = F.when(condition, text).otherwise(detail)
    helpers = ("v", "top_type", "key_type", "value_type", "time_raw")
    return df.withColumn("reason", reason).withColumn("detail", detail).drop(*helpers)


def _json_field(name: str | None) -> Column:
    if name is None:
        return F.lit(None).cast("string")
    if not name.replace("_", "").isalnum():
        raise ValueError(f"field name {name!r} must be letters, digits and '_'")
    return F.expr(f"try_variant_get(v, '$.{name}', 'string')")


def _attribute(name: str | None) -> Column:
    if name is None:
        return F.lit(None).cast("string")
    return F.element_at(F.col("attributes"), F.lit(name))


def ingest_batch(
    spark: SparkSession,
    pipeline: Pipeline,
    plan: BatchPlan,
    landed: DataFrame,
    raw_path: str,
    dead_letter_path: str,
) -> IngestResult:
    """Commit one landed batch to the raw and dead-letter tables, exactly once (or at least once)."""
    ensure_tables(spark, raw_path, dead_letter_path)
    result = IngestResult(batch_id=plan.batch_id)
    ingested_at = F.expr(f"timestamp_millis({plan.planned_at_ms})")
    metadata = {"onceflow_source": pipeline.source_id, "onceflow_batch": plan.batch_id}
    classified = classify(pipeline, plan, landed).withColumn("batch_id", F.lit(plan.batch_id).cast("bigint")).cache()
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
            "key",
            "value",
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
