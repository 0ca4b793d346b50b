"""The raw and dead-letter tables' layout: columns, time buckets, and creating (or evolving) the raw table."""

from __future__ import annotations

from pyspark.sql import types as T

from onceflow.jobs.declare.declaration import Pipeline
from onceflow.jobs.declare.schema import parse_schema
from onceflow.jobs.delta.schema_evolution import evolve_raw_table
from onceflow.jobs.delta.transactions import create_table_once, table_properties

DEAD_LETTER_SCHEMA = parse_schema(
    "source_position STRING, raw STRING, reason STRING NOT NULL, detail STRING, record_id STRING NOT NULL, "
    "event_time TIMESTAMP, batch_id BIGINT, ingested_at TIMESTAMP"
)


RAW_STATS_COLUMNS = ("record_id", "event_time", "batch_id")
"""What reads of the raw table skip files by (windows read event-time ranges); statistics of the payload's
columns would cost every append a large share of its time for no reader."""


BUCKET_MS = 3_600_000
"""The raw table's time bucket (its partition column, `time_bucket`): whole hours since the epoch, the unit in
which the dedup horizon prunes the MERGE. Epoch arithmetic, so no session time zone can shift it."""


def bucket_of(column: str) -> str:
    """SQL for the time bucket of a TIMESTAMP column."""
    return f"CAST(floor(unix_millis({column}) / {BUCKET_MS}) AS BIGINT)"


def raw_schema(pipeline: Pipeline) -> T.StructType:
    """The raw table's columns: `record_id`, `event_time`, the record schema's fields, onceflow's bookkeeping, then
    what the source keeps of a record besides (Kafka: its key and headers)."""
    return T.StructType([
        *parse_schema("record_id STRING NOT NULL, event_time TIMESTAMP NOT NULL").fields,
        *pipeline.record_schema.fields,
        *parse_schema("payload STRING, source_position STRING, publish_time TIMESTAMP, batch_id BIGINT, "
                      "ingested_at TIMESTAMP, time_bucket BIGINT NOT NULL").fields,
        *pipeline.source.bookkeeping.fields,
    ])


def ensure_raw_table(raw_path: str, pipeline: Pipeline) -> None:
    create_table_once(raw_path, raw_schema(pipeline),
                      table_properties(pipeline.retention_s, RAW_STATS_COLUMNS), partitioned_by=("time_bucket",))
    # A table made for an earlier declaration gains its new nullable fields; any other change is refused.
    evolve_raw_table(pipeline, raw_path, raw_schema(pipeline))
