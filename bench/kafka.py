"""Kafka -> raw: onceflow's `KafkaSource` against the Structured Streaming job a Spark user writes for the same
topic, and the floor (`python -m bench.run --only kafka`; `--kafka-*` options).

The clean data set's lines (events plus 10% publisher retries, `bench.datasets.CLEAN`) are produced once, keyed
and with the record ID as the `event_id` header, to a topic of three partitions on a real KRaft broker started
here. Then, after a discarded warm-up round, the contenders alternate (in order, then in reverse), each reading the
whole topic from offset 0 in batches of `--kafka-batch` records into a table of its own:

- `exactly_once`: onceflow micro-batches (`run_micro_batch`) of `KafkaSource(id_header="event_id",
  timestamp_field="event_time")` until the topic is drained;
- `streaming_dedup`: Spark's Kafka source (`maxOffsetsPerTrigger`, `trigger(availableNow=True)`), `from_json` with
  the same schema, a watermark and `dropDuplicatesWithinWatermark` on the ID, a `foreachBatch` Delta append made
  idempotent by `txnAppId` / `txnVersion` (`bench.peer`'s sink);
- `floor`: one batch read of the topic, `from_json`, a Delta append; no dedup.

Timed: the whole drain (onceflow's every batch, the stream's `start()` to `awaitTermination()`, the floor's one
action). Checked, untimed, with delta-rs: every contender that deduplicates holds each distinct ID once and the
floor every message.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
from confluent_kafka import Producer
from deltalake import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from bench.datasets import CLEAN, BenchmarkError, write_events
from bench.peer import WATERMARK, append_sink
from onceflow.jobs.declare.declaration import Pipeline
from onceflow.jobs.declare.sources import KafkaSource
from onceflow.jobs.ingest.micro_batch import run_micro_batch
from onceflow.jobs.sources.reader import open_source
from onceflow.orchestration.pipelines import resolve
from onceflow.resources.emulators.kafka import KafkaBroker, start_kafka_broker
from onceflow.resources.lake import LakeResource
from onceflow.resources.settings import load_settings

CONTENDERS = ("exactly_once", "streaming_dedup", "floor")
EVENTS = 100_000
BATCH = 25_000
ROUNDS = 3
TOPIC = "onceflow-bench"
PARTITIONS = 3


def produce_lines(broker: KafkaBroker, directory: Path) -> int:
    """Every line of the data set's files as one record, keyed and headed by its ID; how many were sent."""
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 20, "enable.idempotence": True})
    sent = 0
    for path in sorted(directory.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            event_id = str(json.loads(line)[CLEAN.id_field]).encode()
            while True:
                try:
                    producer.produce(TOPIC, value=line.encode(), key=event_id, headers=[("event_id", event_id)])
                    break
                except BufferError:  # the producer's queue is full: let it deliver some first
                    producer.poll(0.5)
            producer.poll(0)
            sent += 1
    if producer.flush(60):
        raise BenchmarkError("the producer did not deliver every record within 60 s")
    return sent


def _records(spark: SparkSession, broker: KafkaBroker, streaming: bool, batch: int) -> DataFrame:
    reader = spark.readStream if streaming else spark.read
    options = {"kafka.bootstrap.servers": broker.bootstrap, "subscribe": TOPIC, "startingOffsets": "earliest"}
    if streaming:
        options["maxOffsetsPerTrigger"] = str(batch)
    raw = reader.format("kafka").options(**options).load()
    parsed = raw.select(F.from_json(F.col("value").cast("string"), CLEAN.reader_schema).alias("r")).select("r.*")
    return parsed.withColumn(CLEAN.time_field, F.timestamp_millis(CLEAN.time_field))


def run_once(spark: SparkSession, broker: KafkaBroker, contender: str, home: Path, batch: int) -> tuple[float, str]:
    """One contender's drain of the topic: its seconds and the table it wrote."""
    if contender == "exactly_once":
        source = KafkaSource(bootstrap_servers=broker.bootstrap, topic=TOPIC, id_header="event_id",
                             timestamp_field=CLEAN.time_field, max_records=batch)
        pipeline = resolve(Pipeline(name=CLEAN.pipeline_name, source=source, schema=CLEAN.schema), load_settings())
        runtime = open_source(pipeline, LakeResource(home=str(home)))
        start = time.perf_counter()
        while run_micro_batch(lambda: spark, runtime) is not None:
            pass
        return time.perf_counter() - start, runtime.raw_path
    table = str(home / "table")
    if contender == "floor":
        start = time.perf_counter()
        _records(spark, broker, streaming=False, batch=batch).write.format("delta").mode("append").save(table)
        return time.perf_counter() - start, table
    stream = _records(spark, broker, streaming=True, batch=batch).withWatermark(CLEAN.time_field, WATERMARK)
    writer = (stream.dropDuplicatesWithinWatermark([CLEAN.id_field]).writeStream
              .foreachBatch(append_sink(table, f"bench-{home.name}"))
              .option("checkpointLocation", str(home / "checkpoint")))
    start = time.perf_counter()
    writer.trigger(availableNow=True).start().awaitTermination()
    return time.perf_counter() - start, table


def _check(contender: str, table: str, id_column: str, events: int, sent: int) -> None:
    ids = DeltaTable(table).to_pyarrow_table(columns=[id_column])[id_column]
    distinct = len(pc.unique(ids))
    expected = (sent, events) if contender == "floor" else (events, events)
    if (len(ids), distinct) != expected:
        raise BenchmarkError(f"kafka {contender}: {len(ids)} rows, {distinct} distinct IDs; expected {expected}")


def sizes(args: argparse.Namespace) -> tuple[int, int, int]:
    """The `--kafka-*` options: distinct events, timed rounds, records per batch."""
    return (getattr(args, "kafka_events", None) or EVENTS, getattr(args, "kafka_rounds", None) or ROUNDS,
            getattr(args, "kafka_batch", None) or BATCH)


@contextmanager
def clean_topic(tmp: Path, events: int) -> Iterator[tuple[KafkaBroker, int]]:
    """A broker started under `tmp` with the topic holding the clean data set's lines: it and how many were sent."""
    broker = start_kafka_broker(data_dir=tmp / "broker")
    try:
        broker.create_topic(TOPIC, partitions=PARTITIONS)
        write_events(tmp / "files", events, files=20)
        yield broker, produce_lines(broker, tmp / "files")
    finally:
        broker.stop()


def kafka(spark: SparkSession, args: argparse.Namespace) -> dict[str, Any]:
    """The JSON-ready result (see the module docstring)."""
    events, rounds, batch = sizes(args)
    runs: dict[str, list[dict[str, Any]]] = {c: [] for c in CONTENDERS}
    with tempfile.TemporaryDirectory(prefix="onceflow-bench-kafka-") as tmp, clean_topic(Path(tmp), events) as (
            broker, sent):
        for round_no in range(rounds + 1):
            order = list(CONTENDERS) if round_no % 2 else list(CONTENDERS)[::-1]
            for contender in order:
                seconds, table = run_once(spark, broker, contender, Path(tmp) / f"{contender}-{round_no}", batch)
                _check(contender, table, "record_id" if contender == "exactly_once" else CLEAN.id_field,
                       events, sent)
                print(f"kafka round {round_no}{' (warm-up, discarded)' if not round_no else ''} {contender}: "
                      f"{sent} records in {seconds:.2f} s, {sent / seconds:,.0f} records/s", flush=True)
                if round_no:
                    runs[contender].append({"round": round_no, "seconds": seconds, "records_per_s": sent / seconds})
    median = {c: statistics.median(r["records_per_s"] for r in runs[c]) for c in CONTENDERS}
    by_round = [e["records_per_s"] / s["records_per_s"] for e, s in zip(runs["exactly_once"], runs["streaming_dedup"],
                                                                         strict=True)]
    return {
        "records_per_s": median,
        "exactly_once_over_streaming_dedup": median["exactly_once"] / median["streaming_dedup"],
        "exactly_once_over_streaming_dedup_by_round": by_round,
        "exactly_once_over_floor": median["exactly_once"] / median["floor"],
        "runs": runs,
        "config": {"events": events, "messages": sent, "rounds": rounds, "batch": batch, "partitions": PARTITIONS},
    }
