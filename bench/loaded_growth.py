"""Table growth as the issue's outside benchmark measured it: raw tables *loaded by onceflow itself*, batch by batch,
to N records inside the dedup horizon, where `bench.table_growth` bulk-loads them in one Spark write (20 files).

A table onceflow fills holds what ingest leaves behind: a data file per batch and time bucket, a dead-letter file
per batch, a commit per batch in each log, a source checkpoint that lists every file taken. Whatever of that a
batch's cost follows shows here and not in the bulk-loaded tables.

Per size N (`--growth-rows`), on `bench.run`'s Spark session: a fresh home for the `events` file pipeline, with the
ID filters, ingests files of `--growth-batch-records` records (fresh events in time order over `LOADED_HOURS`
hours, 10 % publisher retries, `BAD_PER_BATCH` bad records) until its raw table holds N; not timed (`load_s`).
Then `TIMED` batches per home, alternating fresh and redelivery batches and, batch by batch, the homes (drift is
shared, as in `bench.table_growth`): a fresh batch's events are in the last hour; a redelivery batch's holds, in
place of a tenth of them, valid records drawn from the files that home loaded (from anywhere in the horizon), each
of which must be found committed. Each `run_micro_batch` is timed as in `bench.table_growth` (its read ahead
dropped, its filters' upkeep settled), with its stage times. Checked, not timed: each raw table holds every
distinct valid record once. `ratio_*`: the largest N's median over the smallest's; the first batch of each kind
is left out of the medians.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from bench.datasets import CLEAN, BenchmarkError
from bench.growth_data import BAD_PER_BATCH, HOUR_MS, LOADED_HOURS, RETRY_FRACTION, bad_lines
from bench.stages import batch_medians, stage_text
from bench.table_growth import BATCH_RECORDS, SIZES, table_facts, timed_batch
from onceflow.jobs.dedup.filter_store import IdFilterStore
from onceflow.jobs.ingest.micro_batch import run_micro_batch
from onceflow.jobs.sources.reader import SourceRuntime, open_source
from onceflow.resources.lake import LakeResource

TIMED = 24  # per home: 12 fresh and 12 redelivery batches
KINDS = ("fresh", "redelivery")


def _print(line: str) -> None:
    print(line, flush=True)


@dataclass
class _Home:
    """One size's home, its source directory, what it holds and its timed batches."""

    rows: int
    directory: Path
    source: SourceRuntime
    end_ms: int
    made: int = 0  # distinct valid events written so far
    files: int = 0
    loaded: list[Path] = field(default_factory=list)
    seconds: dict[str, list[float]] = field(default_factory=lambda: {kind: [] for kind in KINDS})
    stages: dict[str, list[dict[str, float]]] = field(default_factory=lambda: {kind: [] for kind in KINDS})

    def write(self, records: int, first_ms: int, span_ms: int, old: list[str], rng: random.Random) -> Path:
        """A batch file: `records` lines of fresh events spread over the span (with retries among them), the
        `old` lines and `BAD_PER_BATCH` bad records, shuffled; moved into the source directory whole."""
        fresh = round((records - BAD_PER_BATCH - len(old)) / (1 + RETRY_FRACTION))
        lines = [f'{{"event_id": "v{self.made + i}", "event_time": {first_ms + span_ms * i // fresh}, '
                 f'"key": "k{i % 10}", "value": {(self.made + i) % 997}}}' for i in range(fresh)]
        self.made += fresh
        lines += rng.sample(lines, records - BAD_PER_BATCH - len(old) - fresh) + old
        lines += bad_lines([f"bad-{self.files}-{n}" for n in range(BAD_PER_BATCH)], first_ms)
        rng.shuffle(lines)
        path, staged = self.directory / f"part-{self.files:06d}.jsonl", self.directory.parent / "staged.tmp"
        staged.write_text("".join(f"{line}\n" for line in lines))
        os.replace(staged, path)  # as a producer moves a finished file in
        self.files += 1
        return path

    def redelivered(self, count: int, rng: random.Random) -> list[str]:
        """`count` valid lines of distinct records from the files loaded, drawn from all of them."""
        picked: dict[str, str] = {}
        while len(picked) < count:
            for line in rng.sample(rng.choice(self.loaded).read_text().splitlines(), 64):
                if '"bad-' not in line:
                    picked.setdefault(line.split('"', 4)[3], line)
        return list(picked.values())[:count]


def load(spark: SparkSession, rows: int, batch_records: int, work: Path) -> tuple[_Home, float]:
    """A home whose raw table onceflow filled with `rows` records, batch by batch; and the seconds it took."""
    directory = work / "in"
    directory.mkdir(parents=True)
    end_ms = (int(time.time() * 1000) // HOUR_MS - 1) * HOUR_MS
    source = open_source(CLEAN.pipeline(directory, "exactly_once", files_per_batch=1),
                         LakeResource(home=str(work / "home"), id_filters=True))
    home, rng, span = _Home(rows, directory, source, end_ms), random.Random(rows), (LOADED_HOURS - 1) * HOUR_MS
    start = time.perf_counter()
    while home.made < rows:
        first_ms = end_ms - LOADED_HOURS * HOUR_MS + span * home.made // rows
        # Before the timed batches' hour, whatever the batch's share of the rows (none in the future)
        span_ms = min(span * batch_records // rows + 1, end_ms - HOUR_MS - first_ms)
        home.loaded.append(home.write(batch_records, first_ms, span_ms, [], rng))
        if run_micro_batch(lambda: spark, source) is None:
            raise BenchmarkError(f"loaded_growth {rows}: a file was not ingested")
    IdFilterStore.settle()
    return home, time.perf_counter() - start


def time_batch(spark: SparkSession, home: _Home, kind: str, batch_records: int, rng: random.Random) -> None:
    """Write, run and time one batch of `kind` on `home`, checking what it found committed."""
    old = home.redelivered(batch_records // 10, rng) if kind == "redelivery" else []
    home.write(batch_records, home.end_ms - HOUR_MS, HOUR_MS, old, rng)
    result, elapsed = timed_batch(spark, home.source)
    if result is None or result.duplicates_committed != len(old) or result.dead_lettered_total != BAD_PER_BATCH:
        raise BenchmarkError(f"loaded_growth {home.rows} {kind}: expected {len(old)} records found committed and "
                             f"{BAD_PER_BATCH} dead letters, the batch gave {result}")
    home.seconds[kind].append(elapsed)
    home.stages[kind].append(dict(result.times.ms))


def figures(home: _Home, load_s: float) -> dict[str, Any]:
    """One size's figures, once its raw table is checked."""
    total, unique = table_facts(home.source.raw_path)
    if total != home.made or unique != total:
        raise BenchmarkError(f"loaded_growth {home.rows}: raw table has {total} rows ({unique} distinct); "
                             f"expected {home.made}")
    return {"rows": total, "load_s": load_s, "batches_loaded": len(home.loaded),
            **{f"{kind}_s": statistics.median(home.seconds[kind][1:]) for kind in KINDS},
            "seconds": home.seconds, "stage_ms": {kind: batch_medians(home.stages[kind][1:]) for kind in KINDS},
            "checked": True}


def loaded_growth(spark: SparkSession, args: argparse.Namespace) -> dict[str, Any]:
    """The JSON-ready result (see the module docstring)."""
    sizes: tuple[int, ...] = getattr(args, "growth_rows", None) or SIZES
    batch_records: int = getattr(args, "growth_batch_records", None) or BATCH_RECORDS
    with tempfile.TemporaryDirectory(prefix="onceflow-bench-loaded-") as tmp:
        homes = []
        for rows in sizes:
            home, load_s = load(spark, rows, batch_records, Path(tmp) / f"rows-{rows}")
            _print(f"loaded_growth {rows:,} rows: loaded by onceflow in {len(home.loaded)} batches, {load_s:.0f} s")
            homes.append((home, load_s))
        rng = random.Random(7)
        for batch in range(TIMED):
            for home, _ in homes if batch % 2 else homes[::-1]:
                time_batch(spark, home, KINDS[batch % 2], batch_records, rng)
        measured = {str(home.rows): figures(home, load_s) for home, load_s in homes}
    small, large = measured[str(sizes[0])], measured[str(sizes[-1])]
    return {
        **{f"ratio_{kind}": large[f"{kind}_s"] / small[f"{kind}_s"] if len(sizes) > 1 else None for kind in KINDS},
        "ratio_sizes": [sizes[0], sizes[-1]],
        "sizes": measured,
        "config": {"records_per_batch": batch_records, "timed_batches": TIMED, "redelivered_fraction": 0.1,
                   "retry_fraction": RETRY_FRACTION, "bad_records_per_batch": BAD_PER_BATCH,
                   "loaded_hours": LOADED_HOURS},
    }


def lines(result: dict[str, Any]) -> list[str]:
    """Printed: per size its medians and stages, then the ratios."""
    out = []
    for rows, size in result["sizes"].items():
        out.append(f"loaded_growth {int(rows):>12,} rows (loaded by onceflow in {size['batches_loaded']} batches): "
                   + ", ".join(f"{kind} batch {size[f'{kind}_s']:.2f} s" for kind in KINDS))
        out += [f"loaded_growth {int(rows):>12,} rows: {kind} batch, median ms: {stage_text(ms)}"
                for kind, ms in size["stage_ms"].items()]
    small, large = result["ratio_sizes"]
    out.append(f"loaded_growth {large:,} / {small:,} rows: "
               + ", ".join(f"{kind} x{result[f'ratio_{kind}'] or float('nan'):.2f}" for kind in KINDS))
    return out
