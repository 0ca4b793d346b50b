"""Ingest time per batch as the raw and dead-letter tables grow inside the dedup horizon, with and without the dedup
fast path (docs/design.md section 10, benchmark 2). The data: `bench.growth_data`.

Per table size N (`--growth-rows`, default 1,000,000 and 10,000,000), on `bench.run`'s Spark session, steps 1-3
for every size first, then steps 4-5 batch by batch across the sizes (each batch of the 1 M home beside the same
batch of the 10 M one, the sizes' order alternating): run one size after the other, minutes apart, the ratio
of their medians moved from 0.7 to 1.5 between runs of the same commit with what else the machine was doing.

1. A fresh onceflow home for the `events` file pipeline; the tables are created as ingest creates them
   (`onceflow.jobs.ingest.batch_read.ensure_tables`), then N synthetic rows are appended to the raw table by one
   Spark write (uuid-like record IDs, event times spread over the `LOADED_HOURS` hours before the newest test
   event, so every row is inside the 24 h dedup horizon of every test batch), and N dead letters to the
   dead-letter table (from batches before the timed ones). Not timed (reported as `bulk_load_s`).
2. The home is copied (`shutil.copytree`): the original runs without the fast path (`LakeResource(id_filters=
   False)`: every batch MERGEs against the whole horizon), the copy with it. Neither has a `filters` directory.
3. With: both tables' ID filters are rebuilt from the tables as a first fast-path batch would (`IdFilterStore.load`
   of every bucket, then `save`). Timed on its own: `filter_rebuild_s`.
4. Both homes ingest the same files of fresh events (`--growth-batches` files of about `--growth-batch-records`
   records: events plus 10% publisher retries, event times inside the loaded span, and 0.5 % bad records: dead
   letters; without the fast path, their IDs are looked up in the dead-letter table's `record_id` column), one `run_micro_batch` per
   file: first every batch of the home with the fast path, then every batch of the one without (interleaved, a
   fast-path batch after a 10 M-row MERGE paid for that MERGE's garbage, and the ratio measured the neighbour
   rather than the table's size). Each batch starts once the disk has written back the writes before it
   (`os.sync`). Each `run_micro_batch` is timed (plan, read, validate, dedup, commit, checkpoint): its own read
   too, as what the batch before read ahead (`onceflow.jobs.sources.read_ahead`) is dropped first; and with its
   filters' upkeep (its new IDs added, the filters saved when due), which a process does beside its next batch:
   timed without it, a batch paid for the other size's upkeep, run just before it. The figure per home is the median.
5. Then `REDELIVERY_BATCHES` more batches per home, timed apart (`*_redelivery_s`, their median: one batch's
   time varied by a fifth from run to run): a tenth of each one's records are bulk-loaded records drawn from the
   whole horizon (a producer replaying random old records, a subscription seek: the repeats no recent commit
   holds), the rest fresh events; half their bad records are bulk-loaded dead letters, drawn from the whole
   dead-letter table. Every redelivered record, good or bad, must be found committed.
6. Checked, not timed: each raw table then holds N + the distinct fresh events, each dead-letter table N + the
   fresh bad records, all of them distinct.

Each fast-path batch's stage times (`onceflow.jobs.ingest.stage_times`) are kept too, their medians per size as
`with_stage_ms` (fresh and redelivery batches): a ratio of whole batches carries their noise, the stages show what
grew.

A discarded warm-up (a small table, two batches and the redeliveries per home) runs first. `ratio_*` is the median
per-batch time at the largest N over that at the smallest; `ratio_redelivery_*` the same for the redelivery batch.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from bench.datasets import CLEAN, BenchmarkError
from bench.growth_data import (
    BAD_PER_BATCH,
    FRESH_HOURS,
    HOUR_MS,
    LOADED_HOURS,
    RETRY_FRACTION,
    Redelivery,
    bulk_load,
    write_batches,
    write_redelivery,
)
from bench.stages import batch_medians
from onceflow.jobs.dedup.filter_store import IdFilterStore
from onceflow.jobs.dedup.fingerprints import Fingerprints, id_hashes
from onceflow.jobs.ingest.micro_batch import run_micro_batch
from onceflow.jobs.ingest.result import IngestResult
from onceflow.jobs.sources.reader import SourceRuntime, open_source
from onceflow.resources.lake import LakeResource

SIZES = (1_000_000, 10_000_000)
BATCHES = 8  # a batch's time varies by a third from batch to batch: the median of 4 moved the ratio by 0.3
# The median of 5 moved the ratio by 0.3 between runs: one batch in five ran a third slower; that of 9 gave x1.10
# in two runs where 15 gave x1.00, with every stage but the 3 ms of the lookup equal (`with_stage_ms`).
REDELIVERY_BATCHES = 15
BATCH_RECORDS = 25_000
WARMUP_ROWS = 10_000
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


def rebuild_filters(source: SourceRuntime) -> tuple[float, int]:
    """Rebuild both tables' ID filters from the tables and persist them, as a first fast-path batch does (horizon
    floor None: every bucket); seconds taken and the raw table's buckets built."""
    stores = (source.id_filters, source.dead_letter_filters)
    start, buckets = time.perf_counter(), 0
    for store in stores:
        if store is None:
            raise BenchmarkError("the fast-path home lacks an ID filter store")
        filters = store.load(None)
        store.save(filters)
        if not filters.rebuilt:
            raise BenchmarkError("the ID filters were not rebuilt from the table: a filters directory was left over")
        buckets = buckets or len(filters.buckets)
    return time.perf_counter() - start, buckets


def table_facts(path: str) -> tuple[int, int]:
    """A table's rows and distinct record IDs, read with delta-rs a record batch at a time and counted by their
    128-bit fingerprints (16 bytes an ID: the check must not be what sets the benchmark's peak memory). Two IDs
    sharing a fingerprint would count as one: a false alarm, never a repeat missed."""
    dataset = DeltaTable(path).to_pyarrow_dataset()
    prints = Fingerprints.concat([id_hashes(batch.column(0)) for batch in dataset.to_batches(columns=["record_id"])])
    order = np.lexsort((prints.second, prints.first))
    first, second = prints.first[order], prints.second[order]
    repeats = int(((first[1:] == first[:-1]) & (second[1:] == second[:-1])).sum())
    return len(prints), len(prints) - repeats


@dataclass
class _Size:
    """One table size's homes (`sources`, by variant) and what their batches gave so far."""

    rows: int
    batches: int
    sources: dict[str, SourceRuntime]
    distinct: int
    fresh_bad: int
    redelivered: Redelivery
    facts: dict[str, Any]
    seconds: dict[str, list[float]] = field(default_factory=lambda: {name: [] for name in VARIANTS})
    inserted: dict[str, int] = field(default_factory=lambda: dict.fromkeys(VARIANTS, 0))
    fast_path: list[dict[str, Any]] = field(default_factory=list)
    stages: list[dict[str, float]] = field(default_factory=list)


def prepare(
    spark: SparkSession, rows: int, batches: int, batch_records: int, work: Path, log: Callable[[str], None],
) -> _Size:
    """One size's bulk load, copy, redelivery files and filter rebuild (steps 1-3 of the module)."""
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
    fresh_bad = batches * BAD_PER_BATCH
    for seed in range(REDELIVERY_BATCHES):
        redelivered, fresh = write_redelivery(spark, sources["without"], rows,
                                              source_dir / f"part-{batches + seed:03d}.jsonl", batch_records, end_ms,
                                              seed)
        distinct += fresh
        fresh_bad += BAD_PER_BATCH - redelivered.dead
    rebuild_s, buckets = rebuild_filters(sources["with"])
    log(f"table_growth {rows:,} rows: filter rebuild {rebuild_s:.2f} s ({buckets} buckets)")
    facts = {"filter_rebuild_s": rebuild_s, "bulk_load_s": bulk_s, "raw_files": raw_files, "filter_buckets": buckets}
    return _Size(rows, batches, sources, distinct, fresh_bad, redelivered, facts)


def timed_batch(spark: SparkSession, source: SourceRuntime) -> tuple[IngestResult | None, float]:
    """One `run_micro_batch` of `source` and its seconds, timed whole: from its own read (what the batch before read
    ahead is dropped) to its filters' upkeep, settled (its own, not the next batch's)."""
    source.read_ahead.drop()
    os.sync()  # the bulk load's and the batch before's writes are on disk: a checkpoint's fsync waits for none
    start = time.perf_counter()
    result = run_micro_batch(lambda: spark, source)
    IdFilterStore.settle()
    return result, time.perf_counter() - start


def time_batch(spark: SparkSession, size: _Size, name: str, batch: int, log: Callable[[str], None]) -> None:
    """Run and time batch `batch` of one size's home `name`, checking what it found committed (step 4 or 5)."""
    rows, batches, redelivered, source = size.rows, size.batches, size.redelivered, size.sources[name]
    result, elapsed = timed_batch(spark, source)
    if result is None or result.batch_id != batch or result.dead_lettered_total != BAD_PER_BATCH:
        raise BenchmarkError(f"table_growth {rows} {name}: batch {batch} gave {result}")
    # A fresh batch may repeat the batch before's records (a retry across files), never its bad ones.
    found = (result.duplicates_committed if batch > batches else 0, result.dead_letter_duplicates)
    if found != ((redelivered.valid, redelivered.dead) if batch > batches else (0, 0)):
        raise BenchmarkError(f"table_growth {rows} {name}: batch {batch} found {found} of its "
                             "(valid, dead) records committed before")
    if name == "with" and (result.fast_path is None or result.fast_path["filters_rebuilt"]):
        raise BenchmarkError(f"table_growth {rows}: batch {batch} did not use the saved filters: "
                             f"{result.fast_path}")
    size.seconds[name].append(elapsed)
    size.inserted[name] += result.inserted
    if name == "with":
        size.fast_path.append(dict(result.fast_path or {}))
        size.stages.append(dict(result.times.ms))
    log(f"table_growth {rows:,} rows: batch {batch} {name} fast path: {result.received} records"
        f"{' (redelivery)' if batch > batches else ''}, {elapsed:.2f} s")


def checked(size: _Size) -> dict[str, Any]:
    """Step 6 for one size, then its figures."""
    rows, batches, seconds = size.rows, size.batches, size.seconds
    for name, source in size.sources.items():
        total, unique = table_facts(source.raw_path)
        if total != rows + size.distinct or unique != total or size.inserted[name] != size.distinct:
            raise BenchmarkError(f"table_growth {rows} {name}: raw table has {total} rows ({unique} distinct), "
                                 f"{size.inserted[name]} inserted; expected {rows + size.distinct} rows, "
                                 f"{size.distinct} inserted")
        total, unique = table_facts(source.dead_letter_path)
        if total != rows + size.fresh_bad or unique != total:
            raise BenchmarkError(f"table_growth {rows} {name}: dead-letter table has {total} rows ({unique} "
                                 f"distinct); expected {rows + size.fresh_bad}")
    return {
        "rows": rows,
        "with_batch_s": statistics.median(seconds["with"][:batches]),
        "without_batch_s": statistics.median(seconds["without"][:batches]),
        "with_redelivery_s": statistics.median(seconds["with"][batches:]),
        "without_redelivery_s": statistics.median(seconds["without"][batches:]),
        "with_batch_seconds": seconds["with"],
        "without_batch_seconds": seconds["without"],
        "fast_path": size.fast_path,
        # Where a fast-path batch's time went: what grows with the table shows here, the batch's noise aside.
        "with_stage_ms": {"fresh": batch_medians(size.stages[:batches]),
                          "redelivery": batch_medians(size.stages[batches:])},
        **size.facts,
        "rows_after": rows + size.distinct,
        "dead_letter_rows_after": rows + size.fresh_bad,
        "checked": True,
    }


def measure(
    spark: SparkSession, sizes: tuple[int, ...], batches: int, batch_records: int, work: Path,
    log: Callable[[str], None] = _print,
) -> dict[str, dict[str, Any]]:
    """Every size's homes prepared, then their batches interleaved (see the module), then checked; by size."""
    prepared = [prepare(spark, rows, batches, batch_records, work / f"rows-{rows}", log) for rows in sizes]
    for name in VARIANTS:
        for batch in range(1, batches + REDELIVERY_BATCHES + 1):
            for size in prepared if batch % 2 else prepared[::-1]:
                time_batch(spark, size, name, batch, log)
    return {str(size.rows): checked(size) for size in prepared}


def table_growth(spark: SparkSession, args: argparse.Namespace) -> dict[str, Any] | None:
    """The JSON-ready result of the benchmark (see the module docstring for what is timed)."""
    sizes: tuple[int, ...] = getattr(args, "growth_rows", None) or SIZES
    batches: int = getattr(args, "growth_batches", None) or BATCHES
    batch_records: int = getattr(args, "growth_batch_records", None) or BATCH_RECORDS
    with tempfile.TemporaryDirectory(prefix="onceflow-bench-growth-") as tmp:
        measure(spark, (WARMUP_ROWS,), 2, min(batch_records, 5_000), Path(tmp) / "warmup", log=lambda _: None)
        shutil.rmtree(Path(tmp) / "warmup", ignore_errors=True)
        _print(f"table_growth warm-up: {WARMUP_ROWS:,} rows, two batches per home (discarded)")
        measured = measure(spark, sizes, batches, batch_records, Path(tmp))
    for rows, size in measured.items():
        _print(f"table_growth {int(rows):,} rows: median batch {size['with_batch_s']:.2f} s with the fast path, "
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
            "bad_records_per_batch": BAD_PER_BATCH, "dead_letter_rows": "as many as the raw table's, N",
            "loaded_hours": LOADED_HOURS, "fresh_event_hours": FRESH_HOURS, "dedup_horizon_hours": 24,
            "order": "warm-up (discarded); every size's homes prepared; then batch by batch, every size's home "
                     "with the fast path (sizes alternating in order), then the same for the homes without",
            "timed": TIMED,
        },
    }
