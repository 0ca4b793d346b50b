"""Raw commit -> visible in each sink, for a record output (`python -m bench.run --only sink_latency`;
`--kafka-events` and `--sink-latency-batch` size it).

The clean data set's lines are produced to a topic of three partitions on a real KRaft broker; then, once per
sink, onceflow drains the whole topic in batches of `--sink-latency-batch` records into a record output holding that
sink alone: `PostgresSink` (a real PostgreSQL), `KafkaSink` (the same broker, another topic), `FileSink` (Parquet
on local disk) and `BigQuerySink` (the BigQuery emulator: its figure says what the commit protocol costs in jobs,
not what BigQuery would take). Each batch is published on a thread of its own while the next one is read, as the
ingest job does; its latency runs from its raw commit to its sink's commit done (the publication's sequence
finished). Checked, untimed: each sink holds, by its own count per commit, every distinct ID once.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from bench.datasets import CLEAN, BenchmarkError
from bench.kafka import clean_topic, sizes
from bench.kafka_postgres import onceflow_drain
from onceflow.jobs.declare.bigquery_sink import BigQuerySink
from onceflow.jobs.declare.file_sink import FileSink
from onceflow.jobs.declare.kafka_sink import KafkaSink
from onceflow.jobs.declare.postgres_sink import PostgresSink
from onceflow.jobs.declare.sink import Commit, Sink
from onceflow.jobs.publish.commit_store import CommitStore
from onceflow.resources.emulators.bigquery import start_bigquery_emulator
from onceflow.resources.emulators.postgres import start_postgres
from onceflow.resources.lake import LakeResource

SINKS = ("postgres", "kafka", "files", "bigquery")
LATENCY_BATCH = 5_000


def _percentiles(values: list[float]) -> dict[str, float | int]:
    ordered = sorted(values)
    return {"p50": ordered[len(ordered) // 2], "p90": ordered[int(len(ordered) * 0.9)], "batches": len(ordered)}


def _held(sink: Sink, home: Path, table: str) -> int:
    """The rows `sink` holds for the output's commits, by its own count."""
    store = CommitStore(LakeResource(home=str(home)).commits())
    total = 0
    for seq in store.sequences():
        if not seq.startswith(f"{table}:"):
            continue
        _, epoch, batch = seq.split(":")
        held = sink.rows(Commit(CLEAN.pipeline_name, table, int(epoch.removeprefix("epoch-")),
                                int(batch.removeprefix("batch-"))))
        if held is None:
            raise BenchmarkError(f"sink_latency: {sink.name} does not hold {seq}")
        total += held
    return total


def sink_latency(spark: SparkSession, args: argparse.Namespace) -> dict[str, Any]:
    """The JSON-ready result (see the module docstring)."""
    events, _, _ = sizes(args)
    batch = getattr(args, "sink_latency_batch", None) or LATENCY_BATCH
    latency: dict[str, Any] = {}
    postgres, bigquery = start_postgres(), start_bigquery_emulator()
    try:
        with tempfile.TemporaryDirectory(prefix="onceflow-bench-sink-latency-") as tmp, clean_topic(
                Path(tmp), events) as (broker, _sent):
            bigquery.client().create_dataset(f"{bigquery.project}.bench")
            sinks: dict[str, Sink] = {
                "postgres": PostgresSink(dsn=postgres.dsn, table="latency"),
                "kafka": KafkaSink(bootstrap_servers=broker.bootstrap, topic="latency-out"),
                "files": FileSink(path=f"{tmp}/published", format="parquet"),
                "bigquery": BigQuerySink(table="latency", dataset="bench", project=bigquery.project,
                                         api_endpoint=bigquery.endpoint),
            }
            for name in SINKS:
                home, table = Path(tmp) / name, f"latency_{name}"
                seconds, latencies = onceflow_drain(spark, broker, home, batch, table, sinks[name])
                held = _held(sinks[name], home, table)
                sinks[name].close()
                if held != events:
                    raise BenchmarkError(f"sink_latency {name}: the sink holds {held} rows, expected {events}")
                latency[name] = {**_percentiles(latencies), "drain_s": seconds, "records_per_s": events / seconds}
                print(f"sink_latency {name}: raw commit -> sink p50 {latency[name]['p50']:.2f} s, p90 "
                      f"{latency[name]['p90']:.2f} s over {len(latencies)} batches of {batch}", flush=True)
    finally:
        bigquery.stop()
        postgres.stop()
    return {"raw_commit_to_sink_s": latency, "config": {"events": events, "batch": batch}}
