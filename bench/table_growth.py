"""Ingest time per batch as the raw table grows inside the dedup horizon, with and without the dedup fast path
(DESIGN.md section 10, benchmark 2).

Per table size N (`--growth-rows`, default 1,000,000 and 10,000,000), on `bench.run`'s Spark session:

1. A fresh onceflow home for the `events` file pipeline; the raw table is created as ingest creates it
   (`onceflow.jobs.ingest.batch_ingest.ensure_tables`), then N synthetic rows are appended to it by one Spark write (uuid-like record
   IDs, event times spread over the `LOADED_HOURS` hours before the newest test event, so every row is inside
   the 24 h dedup horizon of every test batch). Not timed (reported as `bulk_load_s`).
2. The home is copied (`shutil.copytree`): the original runs without the fast path (`LakeResource(id_filters=
   False)`: every batch MERGEs against the whole horizon), the copy with it. Neither has a `filters` directory.
3. With: the ID filters are rebuilt from the table as a first fast-path batch would (`IdFilterStore.load` of
   every bucket, then `save`). Timed on its own: `filter_rebuild_s`.
4. Both homes ingest the same files of fresh events (`--growth-batches` files of about `--growth-batch-records`
   records: events plus 10% publisher retries, event times inside the loaded span), one `run_micro_batch` per
   file: first every batch of the home with the fast path, then every batch of the one without (interleaved, a
   fast-path batch after a 10 M-row MERGE paid for that MERGE's garbage, and the ratio measured the neighbour
   rather than the table's size). Each batch starts once the disk has written back the writes before it
   (`os.sync`). Each `run_micro_batch` is timed (plan, read, validate, dedup, commit,
   checkpoint); the figure per home is the median.
5. Then `REDELIVERY_BATCHES` more batches per home, timed apart (`*_redelivery_s`, their median: one batch's
   time varied by a fifth from run to run): a tenth of each one's records are bulk-loaded records drawn from the
   whole horizon (a producer replaying random old records, a subscription seek: the repeats no recent commit
   holds), the rest fresh events. Every redelivered record must be found committed.
6. Checked, not timed: each raw table then holds N + the distinct fresh events, all of them distinct.

A discarded warm-up (a small table, two batches and the redeliveries per home) runs first. `ratio_*` is the median
per-batch time at the largest N over that at the smallest; `ratio_redelivery_*` the same for the redelivery batch.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
from deltalake import DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from bench.datasets import CLEAN, BenchmarkError
from onceflow.jobs.delta.raw_table import bucket_of
from onceflow.jobs.ingest.batch_ingest import ensure_tables
from onceflow.jobs.ingest.micro_batch import run_micro_batch
from onceflow.jobs.sources.reader import SourceRuntime, open_source
from onceflow.orchestration.workload import make_events, with_publisher_retries
from onceflow.resources.lake import LakeResource

SIZES = (1_000_000, 10_000_000)
BATCHES = 4
REDELIVERY_BATCHES = 3
BATCH_RECORDS = 25_000
WARMUP_ROWS = 10_000
RETRY_FRACTION = 0.10
HOUR_MS = 3_600_000
LOADED_HOURS = 20  # the bulk rows' event times: the 20 hours before the newest test event (horizon: 24 h)
FRESH_HOURS = 6  # the test events' event times: the last 6 of those hours
VARIANTS = ("with", "without")
TIMED = ("each run_micro_batch of the test files (plan, read, validate, dedup, commit, checkpoint); the filter "
         "rebuild (IdFilterStore.load + save, every bucket) separately; not the bulk load, copy or checks")


def _print(line: str) -> None:
    print(line, flush=True)


def parse_sizes(text: str) -> tuple[int, ...]:
    """`"1000000,10000000"` (underscores allowed) as sizes, smallest first."""
    sizes = sorted({int(part.replace("_", "")) for part in text.split(",") if part.strip()})
    if not sizes or sizes[0] <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give positive row counts separated by commas")
    return tuple(sizes)


def write_batches(directory: Path, batches: int, records: int, end_ms: int) -> int:
    """One JSON-lines file per batch: fresh events plus publisher retries, event times in the `FRESH_HOURS`
    before `end_ms`; returns the number of distinct events."""
    events = round(batches * records / (1 + RETRY_FRACTION))
    first_ms = end_ms - FRESH_HOURS * HOUR_MS
    stream = with_publisher_retries(make_events(events, first_ms, FRESH_HOURS * HOUR_MS, seed=5, prefix="g"),
                                    RETRY_FRACTION)
    per_file = math.ceil(len(stream) / batches)
    directory.mkdir(parents=True, exist_ok=True)
    for i in range(batches):
        chunk = stream[i * per_file : (i + 1) * per_file]
        (directory / f"part-{i:03d}.jsonl").write_text("".join(f"{e.json_line()}\n" for e in chunk))
    return events


def write_redelivery(
    spark: SparkSession, raw_path: str, path: Path, records: int, end_ms: int, seed: int
) -> tuple[int, int]:
    """A redelivery batch's file: a tenth of `records` are bulk-loaded records drawn from the whole table, the
    rest fresh events (distinct for each `seed`), shuffled; returns (redelivered, fresh)."""
    redelivered = records // 10
    bulk = spark.read.format("delta").load(raw_path).where("batch_id = 0")
    old = [row.payload for row in bulk.sample(fraction=min(1.0, 3 * redelivered / bulk.count()), seed=seed)
           .limit(redelivered).select("payload").collect()]
    if len(old) != redelivered:
        raise BenchmarkError(f"table_growth: sampled {len(old)} of {redelivered} records to redeliver")
    fresh = make_events(records - redelivered, end_ms - FRESH_HOURS * HOUR_MS, FRESH_HOURS * HOUR_MS, seed=seed,
                        prefix=f"r{seed}-")
    lines = old + [e.json_line() for e in fresh]
    random.Random(seed).shuffle(lines)
    path.write_text("".join(f"{line}\n" for line in lines))
    return redelivered, len(fresh)


def bulk_load(spark: SparkSession, source: SourceRuntime, rows: int, end_ms: int) -> None:
    """Create the raw table and append `rows` synthetic rows shaped as ingest writes them (batch 0), one file per
    time bucket, event times over the `LOADED_HOURS` before `end_ms`."""
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


def rebuild_filters(source: SourceRuntime) -> tuple[float, int]:
    """Rebuild the ID filters from the table and persist them, as a first fast-path batch does (horizon floor
    None: every bucket); seconds taken and buckets built."""
    store = source.id_filters
    if store is None:
        raise BenchmarkError("the fast-path home has no ID filter store")
    start = time.perf_counter()
    filters = store.load(None)
    store.save(filters)
    seconds = time.perf_counter() - start
    if not filters.rebuilt:
        raise BenchmarkError("the ID filters were not rebuilt from the table: a filters directory was left over")
    return seconds, len(filters.buckets)


def _table_facts(path: str) -> tuple[int, int]:
    ids = DeltaTable(path).to_pyarrow_table(columns=["record_id"]).column("record_id")
    return len(ids), pc.count_distinct(ids).as_py()


def measure(
    spark: SparkSession, rows: int, batches: int, batch_records: int, work: Path,
    log: Callable[[str], None] = _print,
) -> dict[str, Any]:
    """One size: bulk load, copy, rebuild, then `batches` alternating timed batches per home; see the module."""
    end_ms = (int(time.time() * 1000) // HOUR_MS - 1) * HOUR_MS
    source_dir = work / "source"
    distinct = write_batches(source_dir, batches, batch_records, end_ms)
    pipeline = CLEAN.pipeline(source_dir, "exactly_once", files_per_batch=1)
    homes = {"without": work / "home-without", "with": work / "home-with"}
    start = time.perf_counter()
    bulk_load(spark, open_source(pipeline, LakeResource(home=str(homes["without"]))), rows, end_ms)
    bulk_s = time.perf_counter() - start
    if (homes["without"] / "filters").exists():
        raise BenchmarkError("the bulk-loaded home has a filters directory")
    shutil.copytree(homes["without"], homes["with"])
    sources = {name: open_source(pipeline, LakeResource(home=str(home), id_filters=name == "with"))
               for name, home in homes.items()}
    raw_files = len(DeltaTable(sources["without"].raw_path).file_uris())
    log(f"table_growth {rows:,} rows: bulk load {bulk_s:.1f} s ({raw_files} files)")
    for seed in range(REDELIVERY_BATCHES):
        redelivered, fresh = write_redelivery(spark, sources["without"].raw_path,
                                              source_dir / f"part-{batches + seed:03d}.jsonl", batch_records, end_ms,
                                              seed)
        distinct += fresh
    rebuild_s, buckets = rebuild_filters(sources["with"])
    log(f"table_growth {rows:,} rows: filter rebuild {rebuild_s:.2f} s ({buckets} buckets)")
    seconds: dict[str, list[float]] = {name: [] for name in VARIANTS}
    inserted = dict.fromkeys(VARIANTS, 0)
    fast_path: list[dict[str, Any]] = []
    for name in VARIANTS:
        for batch in range(1, batches + REDELIVERY_BATCHES + 1):
            os.sync()  # the bulk load's and the batch before's writes are on disk: a checkpoint's fsync waits for none
            start = time.perf_counter()
            result = run_micro_batch(lambda: spark, sources[name])
            elapsed = time.perf_counter() - start
            if result is None or result.batch_id != batch or result.dead_lettered_total:
                raise BenchmarkError(f"table_growth {rows} {name}: batch {batch} gave {result}")
            if batch > batches and result.duplicates_committed != redelivered:
                raise BenchmarkError(f"table_growth {rows} {name}: the redelivery batch found "
                                     f"{result.duplicates_committed} of {redelivered} redelivered records")
            if name == "with" and (result.fast_path is None or result.fast_path["filters_rebuilt"]):
                raise BenchmarkError(f"table_growth {rows}: batch {batch} did not use the saved filters: "
                                     f"{result.fast_path}")
            seconds[name].append(elapsed)
            inserted[name] += result.inserted
            if name == "with":
                fast_path.append(dict(result.fast_path or {}))
            log(f"table_growth {rows:,} rows: batch {batch} {name} fast path: {result.received} records"
                f"{' (redelivery)' if batch > batches else ''}, {elapsed:.2f} s")
    for name, source in sources.items():
        total, unique = _table_facts(source.raw_path)
        if total != rows + distinct or unique != total or inserted[name] != distinct:
            raise BenchmarkError(f"table_growth {rows} {name}: raw table has {total} rows ({unique} distinct), "
                                 f"{inserted[name]} inserted; expected {rows + distinct} rows, {distinct} inserted")
    return {
        "rows": rows,
        "with_batch_s": statistics.median(seconds["with"][:batches]),
        "without_batch_s": statistics.median(seconds["without"][:batches]),
        "with_redelivery_s": statistics.median(seconds["with"][batches:]),
        "without_redelivery_s": statistics.median(seconds["without"][batches:]),
        "filter_rebuild_s": rebuild_s,
        "with_batch_seconds": seconds["with"],
        "without_batch_seconds": seconds["without"],
        "fast_path": fast_path,
        "bulk_load_s": bulk_s,
        "raw_files": raw_files,
        "filter_buckets": buckets,
        "rows_after": rows + distinct,
        "checked": True,
    }


def table_growth(spark: SparkSession, args: argparse.Namespace) -> dict[str, Any] | None:
    """The JSON-ready result of the benchmark (see the module docstring for what is timed)."""
    sizes: tuple[int, ...] = getattr(args, "growth_rows", None) or SIZES
    batches: int = getattr(args, "growth_batches", None) or BATCHES
    batch_records: int = getattr(args, "growth_batch_records", None) or BATCH_RECORDS
    measured: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="onceflow-bench-growth-") as tmp:
        warm = Path(tmp) / "warmup"
        measure(spark, WARMUP_ROWS, 2, min(batch_records, 5_000), warm, log=lambda _: None)
        shutil.rmtree(warm, ignore_errors=True)
        _print(f"table_growth warm-up: {WARMUP_ROWS:,} rows, two batches per home (discarded)")
        for rows in sizes:
            work = Path(tmp) / f"rows-{rows}"
            try:
                measured[str(rows)] = size = measure(spark, rows, batches, batch_records, work)
            finally:
                shutil.rmtree(work, ignore_errors=True)
            _print(f"table_growth {rows:,} rows: median batch {size['with_batch_s']:.2f} s with the fast path, "
                   f"{size['without_batch_s']:.2f} s without; redelivery batch {size['with_redelivery_s']:.2f} s "
                   f"with, {size['without_redelivery_s']:.2f} s without; filter rebuild "
                   f"{size['filter_rebuild_s']:.2f} s")
    small, large = measured[str(sizes[0])], measured[str(sizes[-1])]
    several = len(sizes) > 1
    return {
        "ratio_with_fast_path": large["with_batch_s"] / small["with_batch_s"] if several else None,
        "ratio_without": large["without_batch_s"] / small["without_batch_s"] if several else None,
        "ratio_redelivery_with_fast_path": large["with_redelivery_s"] / small["with_redelivery_s"] if several else None,
        "ratio_redelivery_without": large["without_redelivery_s"] / small["without_redelivery_s"] if several else None,
        "ratio_sizes": [sizes[0], sizes[-1]],
        "sizes": measured,
        "config": {
            "batches": batches, "redelivery_batches": REDELIVERY_BATCHES, "redelivered_fraction": 0.1,
            "records_per_batch": batch_records, "retry_fraction": RETRY_FRACTION,
            "loaded_hours": LOADED_HOURS, "fresh_event_hours": FRESH_HOURS, "dedup_horizon_hours": 24,
            "order": "warm-up (discarded), then per size: batches alternate without/with (with/without next)",
            "timed": TIMED,
        },
    }
