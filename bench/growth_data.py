"""The data of `bench.table_growth`: tables bulk-loaded with N rows inside the dedup horizon, and the files of the
timed batches (fresh events, publisher retries, bad records, redeliveries of old good and bad records)."""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from bench.datasets import BenchmarkError
from onceflow.jobs.dedup.buckets import BATCH_RANGES
from onceflow.jobs.delta.raw_table import bucket_of
from onceflow.jobs.ingest.batch_read import ensure_tables
from onceflow.jobs.sources.reader import SourceRuntime
from onceflow.orchestration.workload import make_events, with_publisher_retries

RETRY_FRACTION = 0.10
BAD_PER_BATCH = 125  # 0.5 % of a 25,000-record batch: lines that parse, with an ID, and no number for `value`
HOUR_MS = 3_600_000
LOADED_HOURS = 20  # the bulk rows' event times: the 20 hours before the newest test event (horizon: 24 h)
FRESH_HOURS = 6  # the test events' event times: the last 6 of those hours
OLDER_BUCKETS = 8  # the dead-letter filter buckets the bulk-loaded dead letters fill


@dataclass(frozen=True)
class Redelivery:
    """What a redelivery batch's file holds besides fresh records: old valid records and old dead letters."""

    valid: int
    dead: int


def bad_lines(ids: list[str], event_ms: int) -> list[str]:
    """Records that parse and carry their ID but whose `value` is no number: dead letters with those IDs."""
    return [json.dumps({"event_id": i, "event_time": event_ms, "key": "k0", "value": "n/a"}) for i in ids]


def write_batches(directory: Path, batches: int, records: int, end_ms: int) -> int:
    """One JSON-lines file per batch: fresh events plus publisher retries, event times in the `FRESH_HOURS`
    before `end_ms`, and `BAD_PER_BATCH` fresh bad records; returns the number of distinct valid events."""
    events = round(batches * records / (1 + RETRY_FRACTION))
    first_ms = end_ms - FRESH_HOURS * HOUR_MS
    stream = with_publisher_retries(make_events(events, first_ms, FRESH_HOURS * HOUR_MS, seed=5, prefix="g"),
                                    RETRY_FRACTION)
    per_file = math.ceil(len(stream) / batches)
    directory.mkdir(parents=True, exist_ok=True)
    for i in range(batches):
        chunk = [e.json_line() for e in stream[i * per_file : (i + 1) * per_file]]
        chunk += bad_lines([f"bad-{i}-{n}" for n in range(BAD_PER_BATCH)], end_ms)
        random.Random(i).shuffle(chunk)
        (directory / f"part-{i:03d}.jsonl").write_text("".join(f"{line}\n" for line in chunk))
    return events


def write_redelivery(
    spark: SparkSession, source: SourceRuntime, rows: int, path: Path, records: int, end_ms: int, seed: int
) -> tuple[Redelivery, int]:
    """A redelivery batch's file: a tenth of `records` are bulk-loaded records drawn from the whole raw table, the
    rest fresh events (distinct for each `seed`); `BAD_PER_BATCH` bad records, half of them bulk-loaded dead
    letters drawn from the whole dead-letter table; shuffled. Returns what it redelivers and its fresh events."""
    redelivered = records // 10
    bulk = spark.read.format("delta").load(source.raw_path).where("batch_id = 0")
    old = [row.payload for row in bulk.sample(fraction=min(1.0, 3 * redelivered / bulk.count()), seed=seed)
           .limit(redelivered).select("payload").collect()]
    if len(old) != redelivered:
        raise BenchmarkError(f"table_growth: sampled {len(old)} of {redelivered} records to redeliver")
    fresh = make_events(records - redelivered, end_ms - FRESH_HOURS * HOUR_MS, FRESH_HOURS * HOUR_MS, seed=seed,
                        prefix=f"r{seed}-")
    rng = random.Random(seed)
    dead = BAD_PER_BATCH // 2
    bad = [f"dl-{n}" for n in rng.sample(range(rows), dead)]
    bad += [f"bad-r{seed}-{n}" for n in range(BAD_PER_BATCH - dead)]
    lines = old + [e.json_line() for e in fresh] + bad_lines(bad, end_ms)
    rng.shuffle(lines)
    path.write_text("".join(f"{line}\n" for line in lines))
    return Redelivery(redelivered, dead), len(fresh)


def bulk_load(spark: SparkSession, source: SourceRuntime, rows: int, end_ms: int) -> None:
    """Create the tables; append `rows` synthetic rows shaped as ingest writes them (batch 0) to the raw table, one
    file per time bucket, event times over the `LOADED_HOURS` before `end_ms`; and `rows` dead letters (IDs
    `dl-<n>`) to the dead-letter table. Those stand for the dead letters of the batches before the timed ones, as a
    table that grew batch by batch holds them: their batch numbers (below 0, the timed batches are 1, 2, ...) put
    them in `OLDER_BUCKETS` filter buckets before the one the timed batches add to (`onceflow.jobs.dedup.buckets`)."""
    ensure_tables(source)
    schema = spark.read.format("delta").load(source.raw_path).schema
    span_ms = LOADED_HOURS * HOUR_MS
    hashed = (
        spark.range(rows)
        .withColumn("h", F.sha2(F.col("id").cast("string"), 256))
        .withColumn("ms", F.lit(end_ms - span_ms) + F.pmod(F.xxhash64("id"), F.lit(span_ms)))
        .selectExpr(
            "id", "ms",
            "concat_ws('-', substr(h, 1, 8), substr(h, 9, 4), substr(h, 13, 4), substr(h, 17, 4), substr(h, 21, 12))"
            " AS record_id",
            "concat('k', pmod(id, 10)) AS key",
            "pmod(id * 7919, 1050) - 50 AS v",
        )
    )
    rows_df = hashed.selectExpr(
        "record_id",
        "timestamp_millis(ms) AS event_time",
        "key",
        "CAST(v AS DECIMAL(38, 9)) AS value",
        "format_string('{\"event_id\": \"%s\", \"event_time\": %d, \"key\": \"%s\", \"value\": %d}', record_id, ms, "
        "key, v) AS payload",
        "concat('bulk:', id) AS source_position",
        "CAST(NULL AS TIMESTAMP) AS publish_time",
        "CAST(0 AS BIGINT) AS batch_id",
        f"timestamp_millis({end_ms}) AS ingested_at",
    ).withColumn("time_bucket", F.expr(bucket_of("event_time", source.pipeline.time_bucket_ms)))
    typed = rows_df.select([F.col(f.name).cast(f.dataType) for f in schema])
    typed.repartition("time_bucket").write.format("delta").mode("append").partitionBy("time_bucket").save(
        source.raw_path
    )
    dead_schema = spark.read.format("delta").load(source.dead_letter_path).schema
    dead = spark.range(rows).selectExpr(
        "concat('bulk-dead:', id) AS source_position",
        "format_string('{\"event_id\": \"dl-%d\", \"value\": \"n/a\"}', id) AS raw",
        "'invalid_value' AS reason", "'value: n/a is no number' AS detail", "concat('dl-', id) AS record_id",
        "CAST(NULL AS TIMESTAMP) AS event_time",
        f"-1 - pmod(id, {OLDER_BUCKETS}) * {BATCH_RANGES.batches} AS batch_id",
        f"timestamp_millis({end_ms}) AS ingested_at",
    )
    dead.select([F.col(f.name).cast(f.dataType) for f in dead_schema]).repartition(4).write.format("delta") \
        .mode("append").save(source.dead_letter_path)
