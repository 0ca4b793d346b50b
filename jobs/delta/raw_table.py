"""The raw and dead-letter tables' layout: columns, time buckets, and creating (or evolving) the raw table."""

from __future__ import annotations

from pyspark.sql import types as T

from onceflow.jobs.declare.declaration import DeclarationError, Pipeline
from onceflow.jobs.declare.schema import parse_schema
from onceflow.jobs.delta.schema_evolution import evolve_raw_table
from onceflow.jobs.delta.transactions import create_table_once, table_properties
from onceflow.resources.delta_storage import table_snapshot

DEAD_LETTER_SCHEMA = parse_schema(
    "source_position STRING, raw STRING, reason STRING NOT NULL, detail STRING, record_id STRING NOT NULL, "
    "event_time TIMESTAMP, batch_id BIGINT, ingested_at TIMESTAMP"
)


RAW_STATS_COLUMNS = ("record_id", "event_time", "batch_id")
"""What reads of the raw table skip files by (windows read event-time ranges); statistics of the payload's
columns would cost every append a large share of its time for no reader."""


BUCKET_KEY = "onceflow.bucketMs"
"""The raw table's partition column `time_bucket` holds whole time buckets since the epoch, the unit in which the
dedup horizon prunes (epoch arithmetic, so no session time zone can shift it). The column's metadata holds the
width under this key (`Pipeline.time_bucket`, in milliseconds): in the schema, it is made with the table, in its
first commit (delta-rs makes a table with no properties but Delta's own)."""
LEGACY_BUCKET_MS = 3_600_000
"""The width of raw tables made before the width was a setting: an hour."""


def bucket_of(column: str, bucket_ms: int) -> str:
    """SQL for the time bucket of a TIMESTAMP column."""
    return f"CAST(floor(unix_millis({column}) / {bucket_ms}) AS BIGINT)"


def bucket_ms(raw_path: str) -> int:
    """The width of the raw table's time buckets, as the table says."""
    column = next(f for f in table_snapshot(raw_path).schema().fields if f.name == "time_bucket")
    return int(column.metadata.get(BUCKET_KEY, LEGACY_BUCKET_MS))


def raw_schema(pipeline: Pipeline) -> T.StructType:
    """The raw table's columns: `record_id`, `event_time`, the record schema's fields, onceflow's bookkeeping, then
    what the source keeps of a record besides (Kafka: its key and headers)."""
    return T.StructType([
        *parse_schema("record_id STRING NOT NULL, event_time TIMESTAMP NOT NULL").fields,
        *pipeline.record_schema.fields,
        *parse_schema("payload STRING, source_position STRING, publish_time TIMESTAMP, batch_id BIGINT, "
                      "ingested_at TIMESTAMP").fields,
        T.StructField("time_bucket", T.LongType(), False, {BUCKET_KEY: pipeline.time_bucket_ms}),
        *pipeline.source.bookkeeping.fields,
    ])


_same_buckets: set[tuple[str, int]] = set()  # (table, width) pairs this process has checked


def ensure_raw_table(raw_path: str, pipeline: Pipeline) -> None:
    """Make the raw table unless it exists; `DeclarationError` when it exists with other time buckets than the
    pipeline declares, or a schema it cannot evolve to."""
    create_table_once(raw_path, raw_schema(pipeline),
                      table_properties(pipeline.retention_s, RAW_STATS_COLUMNS), partitioned_by=("time_bucket",))
    if (raw_path, pipeline.time_bucket_ms) not in _same_buckets:
        held = bucket_ms(raw_path)
        if held != pipeline.time_bucket_ms:
            raise DeclarationError(
                f"pipeline {pipeline.name!r}: time_bucket: {pipeline.time_bucket!r}, but its table "
                f"{pipeline.raw_table} is bucketed by {held // 1000}s: a table keeps its buckets (its rows are "
                "partitioned by them); declare the table's width, or the pipeline under a new name")
        _same_buckets.add((raw_path, pipeline.time_bucket_ms))
    # A table made for an earlier declaration gains its new nullable fields; any other change is refused.
    evolve_raw_table(pipeline, raw_path, raw_schema(pipeline))
