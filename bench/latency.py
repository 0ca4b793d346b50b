"""Latency from publish to committed raw row on the Pub/Sub emulator path, without Dagster (docs/design.md section 10,
benchmark 4).

Google's Pub/Sub emulator is started as the project starts it (`onceflow.resources.emulators.pubsub`), in a project of its
own; the built-in `events` pipeline (its Pub/Sub declaration, resolved against the settings) gets a fresh home and
its topic and subscriptions (`open_source(...).reader.ensure()`). On `bench.run`'s Spark session:

- Bursts: `--latency-bursts` times, publish `--latency-burst-events` fresh events (`onceflow.orchestration.workload.
  publish_events`, event times = now), then call `run_micro_batch` until all of them are in the raw table. An
  event's latency is the Delta commit timestamp of the raw table version that holds it minus its Pub/Sub publish
  time (both this machine's clock): publish, pull and landing (including the empty pulls that end a drain of the
  subscriptions), ingest and commit. `publish_to_raw_p50_s` / `_p90_s` are over every event of every timed
  burst; a first burst is a discarded warm-up.
- Drain: publish `--latency-drain-events` events (not timed), then time `run_micro_batch` from the first call to
  the return of the last one that ingested something: `landed_records_per_s` = records / those seconds.

Sensor tick -> commit needs Dagster's daemon and run launcher; `onceflow demo` measures it and leaves it in
`bench/results/demo_latency.json`, which is reported here with when it was measured. `make bench` runs the demo
first (null here when `bench.run` runs alone on a checkout where no demo has run).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from bench.datasets import BenchmarkError
from onceflow.jobs.declare.sources import PubSubSource
from onceflow.jobs.ingest.micro_batch import run_micro_batch
from onceflow.jobs.ingest.result import IngestResult
from onceflow.jobs.sources.reader import SourceRuntime, open_source
from onceflow.orchestration.pipelines import resolve
from onceflow.orchestration.pipelines.events import events_pipeline
from onceflow.orchestration.workload import make_events, publish_events
from onceflow.resources.emulators.pubsub import start_pubsub_emulator
from onceflow.resources.lake import LakeResource
from onceflow.resources.pubsub import PubSubClient
from onceflow.resources.settings import load_settings

BURSTS = 10
BURST_EVENTS = 200
DRAIN_EVENTS = 20_000
WAIT_S = 120.0  # a burst or drain not ingested by then is a failure, not a figure
TIMED = ("per event: raw commit timestamp (Delta log) - Pub/Sub publish time, bursts published then ingested by "
         "run_micro_batch; drain: run_micro_batch from its first call to the last batch's return")


def _print(line: str) -> None:
    print(line, flush=True)


def _quantile(values: list[float], q: int) -> float:
    """The `q`-th percentile (inclusive method); the value itself for a single one."""
    return values[0] if len(values) == 1 else statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def ingest_until(spark: SparkSession, source: SourceRuntime, records: int) -> tuple[list[IngestResult], float]:
    """Run micro-batches until `records` records were received; the results and the seconds from the first call
    to the return of the last batch that received records."""
    results: list[IngestResult] = []
    start = time.perf_counter()
    last = start
    while sum(r.received for r in results) < records:
        result = run_micro_batch(lambda: spark, source)
        if result is not None:
            results.append(result)
            last = time.perf_counter()
        elif time.perf_counter() - start > WAIT_S:
            raise BenchmarkError(f"latency: {sum(r.received for r in results)} of {records} records ingested "
                                 f"after {WAIT_S:.0f} s")
    return results, last - start


def _commit_ms(raw_path: str) -> dict[int, int]:
    """The raw table's commit timestamps (epoch ms) by version."""
    return {entry["version"]: int(entry["timestamp"]) for entry in DeltaTable(raw_path).history()}


def _latencies(raw_path: str, batch_versions: dict[int, int], prefix: str, skip: str) -> list[float]:
    """Seconds from publish to the commit that wrote it, for the raw rows whose ID starts with `prefix` but not
    with `skip` (the warm-up)."""
    commits = _commit_ms(raw_path)
    table = DeltaTable(raw_path).to_pyarrow_table(columns=["record_id", "publish_time", "batch_id"])
    ids = table["record_id"]
    table = table.filter(pc.and_(pc.starts_with(ids, prefix), pc.invert(pc.starts_with(ids, skip))))
    published = pc.cast(pc.cast(table["publish_time"], pa.timestamp("ms", tz="UTC")), pa.int64()).to_pylist()
    return [
        (commits[batch_versions[batch]] - ms) / 1000
        for ms, batch in zip(published, table["batch_id"].to_pylist(), strict=True)
    ]


def _demo_tick_to_commit() -> dict[str, Any]:
    from onceflow.orchestration.cli.demo import DEMO_LATENCY

    if not DEMO_LATENCY.exists():
        return {"tick_to_commit_median_s": None, "tick_to_commit_note": "run make demo to measure it"}
    demo = json.loads(DEMO_LATENCY.read_text())
    figures = demo["latencies_s"]
    return {
        "tick_to_commit_median_s": figures.get("batch requested -> micro-batch committed (median over batches)"),
        "tick_to_commit_note": f"measured by make demo at {demo['measured_at']} ({demo.get('profile', 'local')} "
                               f"profile, {demo.get('engine_path', 'connect')} engine; warm runs: "
                               f"ONCEFLOW_MICRO_BATCH_RUN_S={demo['settings'].get('ONCEFLOW_MICRO_BATCH_RUN_S')})",
        "demo_latencies_s": figures,
    }


def measure(
    spark: SparkSession, client: PubSubClient, home: Path, bursts: int, burst_events: int, drain_events: int,
    log: Callable[[str], None] = _print,
) -> dict[str, Any]:
    """The bursts (after a discarded one), then the drain, into a fresh home; see the module docstring."""
    settings = load_settings().model_copy(update={"events_source": "pubsub", "delivery": "exactly_once"})
    pipeline = resolve(events_pipeline(settings), settings)
    assert isinstance(pipeline.source, PubSubSource)
    source = open_source(pipeline, LakeResource(home=str(home)), lambda: client)
    source.reader.ensure()
    batch_versions: dict[int, int] = {}
    per_burst: list[float] = []
    for burst in range(bursts + 1):
        events = make_events(burst_events, int(time.time() * 1000) - 1000, 1000, seed=burst, prefix=f"b{burst:03d}-")
        start = time.time()
        publish_events(client, pipeline.source.topic, events)
        results, _ = ingest_until(spark, source, burst_events)
        done = time.time()
        batch_versions.update({r.batch_id: r.raw_version for r in results if r.raw_version is not None})
        if sum(r.inserted for r in results) != burst_events:
            raise BenchmarkError(f"latency burst {burst}: {sum(r.inserted for r in results)} of {burst_events} "
                                 f"inserted ({results})")
        if burst:
            per_burst.append(done - start)
        log(f"latency burst {burst}{' (warm-up, discarded)' if not burst else ''}: {burst_events} events published "
            f"and committed in {done - start:.2f} s ({len(results)} batches)")
    latencies = _latencies(source.raw_path, batch_versions, "b", "b000-")
    if len(latencies) != bursts * burst_events:
        raise BenchmarkError(f"latency: {len(latencies)} burst rows in the raw table, expected {bursts * burst_events}")
    drain = make_events(drain_events, int(time.time() * 1000) - 60_000, 60_000, seed=99, prefix="d-")
    publish_events(client, pipeline.source.topic, drain)
    results, seconds = ingest_until(spark, source, drain_events)
    received = sum(r.received for r in results)
    if sum(r.inserted for r in results) != drain_events:
        raise BenchmarkError(f"latency drain: {sum(r.inserted for r in results)} of {drain_events} inserted")
    log(f"latency drain: {received} records in {seconds:.2f} s ({len(results)} batches), "
        f"{received / seconds:,.0f} records/s")
    return {
        **_demo_tick_to_commit(),
        "publish_to_raw_p50_s": statistics.median(latencies),
        "publish_to_raw_p90_s": _quantile(latencies, 90),
        "publish_to_raw_max_s": max(latencies),
        "burst_publish_to_commit_s": per_burst,
        "landed_records_per_s": received / seconds,
        "drain": {"events": drain_events, "records": received, "seconds": seconds, "batches": len(results),
                  "batch_records": [r.received for r in results]},
        "config": {
            "bursts": bursts, "burst_events": burst_events, "warmup_bursts": 1,
            "max_messages": pipeline.source.max_messages, "max_seconds": pipeline.source.max_seconds,
            "pipeline": pipeline.name, "delivery": pipeline.delivery, "timed": TIMED,
        },
    }


def latency(spark: SparkSession, args: argparse.Namespace) -> dict[str, Any] | None:
    """The JSON-ready result of the benchmark (see the module docstring for what is timed)."""
    bursts: int = getattr(args, "latency_bursts", None) or BURSTS
    burst_events: int = getattr(args, "latency_burst_events", None) or BURST_EVENTS
    drain_events: int = getattr(args, "latency_drain_events", None) or DRAIN_EVENTS
    emulator = start_pubsub_emulator(timeout_s=120.0)
    try:
        client = PubSubClient(f"bench-{uuid.uuid4().hex[:10]}", emulator.host)
        with tempfile.TemporaryDirectory(prefix="onceflow-bench-latency-") as tmp:
            result = measure(spark, client, Path(tmp) / "home", bursts, burst_events, drain_events)
    finally:
        emulator.stop()
        shutil.rmtree(emulator.data_dir, ignore_errors=True)
    _print(f"latency: publish -> raw committed p50 {result['publish_to_raw_p50_s']:.2f} s, "
           f"p90 {result['publish_to_raw_p90_s']:.2f} s; drain {result['landed_records_per_s']:,.0f} records/s")
    return result
