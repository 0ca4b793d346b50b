"""Kafka -> PostgreSQL: onceflow's record output against the Structured Streaming job a Spark user writes for it
(`python -m bench.run --only kafka_postgres`; `--kafka-*` options size it).

The clean data set's lines (events plus 10% publisher retries) are produced once to a topic of three partitions on
a real KRaft broker; a real PostgreSQL is started here. After a discarded warm-up round the contenders alternate
(in order, then in reverse), each draining the whole topic in batches of `--kafka-batch` records into a table of
its own:

- `exactly_once`: onceflow micro-batches (`run_micro_batch`) of `KafkaSource(id_header="event_id")`, each
  committed batch published to `PostgresSink` (its rows `COPY`-ed with a marker in one transaction) through the
  record output's commit sequence, on a thread of its own while the next batch is read, as the ingest job does;
- `foreach_batch_jdbc`: Spark's Kafka source (`maxOffsetsPerTrigger`, `trigger(availableNow=True)`), `from_json`,
  `foreachBatch` appending each batch to PostgreSQL over JDBC: what a Spark user writes; at-least-once, and no
  dedup of the producer's retries.

Timed: the whole drain, onceflow's publications included. Checked, untimed, with psycopg: onceflow's table holds
each distinct ID once; the peer's holds every message. Then a replayed batch: onceflow's last publication run again
(its commit sequence re-armed from scratch, every sink step re-executed), the peer's last batch re-run (its offset
commit removed from the checkpoint, as a crash after the write and before the commit leaves it): the duplicates
each table then holds. Per onceflow batch, raw commit -> visible in PostgreSQL (the marker's transaction
committed) gives the latency's p50 and p90.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from bench.datasets import CLEAN, BenchmarkError
from bench.kafka import PARTITIONS, TOPIC, clean_topic, sizes
from onceflow.jobs.declare.declaration import Pipeline
from onceflow.jobs.declare.postgres_sink import PostgresSink
from onceflow.jobs.declare.record_output import RecordOutput
from onceflow.jobs.declare.sink import Sink
from onceflow.jobs.declare.sources import KafkaSource
from onceflow.jobs.ingest.micro_batch import run_micro_batch
from onceflow.jobs.publish.commit_store import CommitStore
from onceflow.jobs.publish.record_sequence import RawBatches, stage_through, start_output
from onceflow.jobs.publish.sequence import CommitSequence, run_sequence
from onceflow.jobs.publish.step import CommitContext
from onceflow.jobs.sources.reader import open_source
from onceflow.orchestration.pipelines import resolve
from onceflow.resources.emulators.kafka import KafkaBroker
from onceflow.resources.emulators.postgres import PostgresServer, start_postgres
from onceflow.resources.lake import LakeResource
from onceflow.resources.maven_jars import MavenArtifact, ensure_artifact, jar_cache_dir
from onceflow.resources.settings import load_settings

CONTENDERS = ("exactly_once", "foreach_batch_jdbc")
JDBC_DRIVER = MavenArtifact("org.postgresql", "postgresql", "42.7.14")


def jdbc_jar() -> str:
    """PostgreSQL's JDBC driver (Maven Central, cached beside onceflow's jars): the peer's JDBC writes need it."""
    return str(ensure_artifact(JDBC_DRIVER, jar_cache_dir()))


def onceflow_drain(spark: SparkSession, broker: KafkaBroker, home: Path, batch: int, table: str,
                   sink: Sink) -> tuple[float, list[float]]:
    """onceflow's drain of the topic into `sink` (record output `table`): its seconds, and each batch's raw commit
    -> sink latency (the sink's commit done)."""
    output = RecordOutput(asset=table, sinks=[sink])
    source = KafkaSource(bootstrap_servers=broker.bootstrap, topic=TOPIC, id_header="event_id",
                         timestamp_field=CLEAN.time_field, max_records=batch)
    pipeline = resolve(Pipeline(name=CLEAN.pipeline_name, source=source, schema=CLEAN.schema, outputs=[output]),
                       load_settings())
    lake = LakeResource(home=str(home))
    runtime = open_source(pipeline, lake)
    raw = RawBatches(pipeline, runtime.raw_path, runtime.app_id, runtime.epoch)
    ctx = CommitContext(CommitStore(lake.commits()), records={table: output})
    start_output(ctx.store, output, raw, runtime.checkpoints.first_batch)
    latencies: list[float] = []

    def publish(batch_id: int, version: int | None, committed_at: float) -> None:
        for seq, _, _ in stage_through(spark, ctx.store, lake.staging_root(), output, raw, batch_id, version):
            if run_sequence(ctx, seq, "bench").outcome != "done":
                raise BenchmarkError(f"kafka_postgres: publication {seq} did not finish")
        latencies.append(time.perf_counter() - committed_at)

    start = time.perf_counter()
    with ThreadPoolExecutor(1) as publisher:
        pending = None
        while (result := run_micro_batch(lambda: spark, runtime)) is not None:
            committed_at = time.perf_counter()
            if pending is not None:
                pending.result()
            pending = publisher.submit(publish, result.batch_id, result.raw_version, committed_at)
        if pending is not None:
            pending.result()
    seconds = time.perf_counter() - start
    sink.close()
    return seconds, latencies


def _replay_onceflow(home: Path, table: str, server: PostgresServer) -> None:
    """onceflow's last publication run again from scratch: a new sequence record with every step pending."""
    lake = LakeResource(home=str(home))
    store = CommitStore(lake.commits())
    last = sorted(s for s in store.sequences() if s.startswith(f"{table}:"))[-1]
    record = store.get(last)
    assert record is not None
    again = CommitSequence.from_record(record)
    replayed = CommitSequence(f"{last}.replay", again.steps[:-1])  # the staged rows' drop apart: it ran already
    output = RecordOutput(asset=table, sinks=[PostgresSink(dsn=server.dsn, table=table)])
    replayed.write(store)
    run_sequence(CommitContext(store, records={table: output}), replayed.id, "bench-replay")


def _peer(spark: SparkSession, broker: KafkaBroker, server: PostgresServer, home: Path, batch: int,
          table: str) -> float:
    """The Structured Streaming job's drain: its seconds."""
    url = f"jdbc:postgresql://{server.host}:{server.port}/{server.database}"
    properties = {"user": server.user, "password": server.password, "driver": "org.postgresql.Driver"}

    def to_postgres(frame: Any, _batch_id: int) -> None:
        frame.write.jdbc(url, table, mode="append", properties=properties)

    raw = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", broker.bootstrap)
           .option("subscribe", TOPIC).option("startingOffsets", "earliest")
           .option("maxOffsetsPerTrigger", str(batch)).load())
    parsed = raw.select(F.from_json(F.col("value").cast("string"), CLEAN.reader_schema).alias("r")).select("r.*")
    writer = (parsed.writeStream.foreachBatch(to_postgres)
              .option("checkpointLocation", str(home / "checkpoint")).trigger(availableNow=True))
    start = time.perf_counter()
    writer.start().awaitTermination()
    return time.perf_counter() - start


def _replay_peer(spark: SparkSession, broker: KafkaBroker, server: PostgresServer, home: Path, batch: int,
                 table: str) -> None:
    """The peer's last batch run again: its offsets' commit removed, as a crash between write and commit leaves."""
    commits = sorted((home / "checkpoint" / "commits").glob("[0-9]*"), key=lambda p: int(p.name))
    commits[-1].unlink()
    (commits[-1].parent / f".{commits[-1].name}.crc").unlink(missing_ok=True)
    _peer(spark, broker, server, home, batch, table)


def _counts(server: PostgresServer, table: str, id_column: str) -> tuple[int, int]:
    with psycopg.connect(server.dsn) as connection:
        found = connection.execute(f'SELECT count(*), count(DISTINCT "{id_column}") FROM {table}').fetchone()
    assert found is not None
    return int(found[0]), int(found[1])


def kafka_postgres(spark: SparkSession, args: argparse.Namespace) -> dict[str, Any]:
    """The JSON-ready result (see the module docstring)."""
    events, rounds, batch = sizes(args)
    runs: dict[str, list[dict[str, Any]]] = {c: [] for c in CONTENDERS}
    latencies: list[float] = []
    duplicates: dict[str, int] = {}
    server = start_postgres()
    try:
        with tempfile.TemporaryDirectory(prefix="onceflow-bench-kafka-pg-") as tmp, clean_topic(Path(tmp), events) as (
                broker, sent):
            for round_no in range(rounds + 1):
                order = list(CONTENDERS) if round_no % 2 else list(CONTENDERS)[::-1]
                for contender in order:
                    home, table = Path(tmp) / f"{contender}-{round_no}", f"{contender}_{round_no}"
                    if contender == "exactly_once":
                        seconds, batch_latencies = onceflow_drain(spark, broker, home, batch, table,
                                                                 PostgresSink(dsn=server.dsn, table=table))
                        expected, id_column = (events, events), "record_id"
                    else:
                        seconds, batch_latencies = _peer(spark, broker, server, home, batch, table), []
                        expected, id_column = (sent, events), CLEAN.id_field
                    if _counts(server, table, id_column) != expected:
                        raise BenchmarkError(f"kafka_postgres {contender}: {_counts(server, table, id_column)} "
                                             f"(rows, distinct IDs); expected {expected}")
                    print(f"kafka_postgres round {round_no}{' (warm-up, discarded)' if not round_no else ''} "
                          f"{contender}: {sent} records in {seconds:.2f} s, {sent / seconds:,.0f} records/s", flush=True)
                    if round_no:
                        runs[contender].append({"round": round_no, "seconds": seconds, "records_per_s": sent / seconds})
                        latencies += batch_latencies
                    if round_no == rounds:  # the last round: a replayed batch, then the duplicates it left
                        rows_before, _ = _counts(server, table, id_column)
                        if contender == "exactly_once":
                            _replay_onceflow(home, table, server)
                        else:
                            _replay_peer(spark, broker, server, home, batch, table)
                        duplicates[contender] = _counts(server, table, id_column)[0] - rows_before
    finally:
        server.stop()
    median = {c: statistics.median(r["records_per_s"] for r in runs[c]) for c in CONTENDERS}
    ordered = sorted(latencies)
    return {
        "records_per_s": median,
        "exactly_once_over_foreach_batch_jdbc": median["exactly_once"] / median["foreach_batch_jdbc"],
        "by_round": [e["records_per_s"] / p["records_per_s"] for e, p in
                     zip(runs["exactly_once"], runs["foreach_batch_jdbc"], strict=True)],
        "duplicates_after_a_replayed_batch": duplicates,
        "raw_commit_to_postgres_s": {"p50": ordered[len(ordered) // 2], "p90": ordered[int(len(ordered) * 0.9)],
                                     "batches": len(ordered)},
        "runs": runs,
        "config": {"events": events, "messages": sent, "rounds": rounds, "batch": batch, "partitions": PARTITIONS},
    }
